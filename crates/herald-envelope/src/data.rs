//! Typed event data and its Avro binary codec (one datum, no container header).

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::{Schema, from_value, to_value};
use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::{EnvelopeError, schema};

/// Most bytes one length-prefixed Avro value (a string, bytes) may claim.
/// apache-avro allocates the claimed length before reading it, up to a
/// process-wide cap (512 MiB by default): a 10-byte record could make a
/// consumer allocate half a gigabyte. Herald's records are far below Kafka's
/// default 1 MiB message limit, so 8 MiB bounds every decode with room.
pub const MAX_AVRO_ALLOCATION: usize = 8 * 1024 * 1024;

/// Sets the cap before the first decode (apache-avro keeps the first value set).
pub(crate) fn bound_allocations() {
    apache_avro::util::max_allocation_bytes(MAX_AVRO_ALLOCATION);
}

/// Data of one event type, written with one schema file.
pub trait EventData: Serialize + DeserializeOwned {
    /// CloudEvents `type`.
    const EVENT_TYPE: &'static str;
    /// The file under `schemas/` this data is written with.
    const SCHEMA_FILE: &'static str;

    /// Avro binary encoding of this datum.
    fn to_avro(&self) -> Result<Vec<u8>, EnvelopeError> {
        let schema = schema::by_file(Self::SCHEMA_FILE)?;
        let err = |reason: String| EnvelopeError::Data { schema: Self::SCHEMA_FILE.to_owned(), reason };
        let value = to_value(self).map_err(|e| err(e.to_string()))?;
        let writer = GenericDatumWriter::builder(schema).build().map_err(|e| err(e.to_string()))?;
        writer.write_value_to_vec(value).map_err(|e| err(e.to_string()))
    }

    /// Decodes `bytes` written with `writer_file` (a schema compiled into
    /// this build) into this type.
    fn from_avro(writer_file: &str, bytes: &[u8]) -> Result<Self, EnvelopeError> {
        Self::from_avro_with(schema::by_file(writer_file)?, writer_file, bytes)
    }

    /// Decodes `bytes` written with `writer` (file `writer_file`) and
    /// resolves them into this type's schema (Avro schema resolution: fields
    /// the reader lacks are skipped, fields the writer lacks take the reader's
    /// default, numbers promote).
    fn from_avro_with(writer: &Schema, writer_file: &str, bytes: &[u8]) -> Result<Self, EnvelopeError> {
        bound_allocations();
        let err = |reason: String| EnvelopeError::Data { schema: writer_file.to_owned(), reason };
        let named = |e: apache_avro::Error| match failing_field(writer, bytes) {
            Some(field) => err(format!("field `{field}`: {e}")),
            None => err(e.to_string()),
        };
        let mut input = bytes;
        let direct = if writer_file == Self::SCHEMA_FILE { read_direct::<Self>(writer, writer_file, &mut input) } else { None };
        let data: Self = match direct {
            Some(data) => data,
            None => {
                // Through apache-avro's generic value, resolving into this
                // type's schema across versions: what decides, and names
                // the field, whenever the direct read did not succeed.
                input = bytes;
                let reader = if writer_file == Self::SCHEMA_FILE { None } else { Some(schema::by_file(Self::SCHEMA_FILE)?) };
                let value = datum_reader(writer, reader).map_err(named)?.read_value(&mut input).map_err(named)?;
                // A string cut short by the end of input arrives here as null.
                from_value(&value).map_err(named)?
            }
        };
        if !input.is_empty() {
            return Err(err(format!("{} trailing bytes after the datum", input.len())));
        }
        data.check_ranges().map_err(|e| EnvelopeError::OutOfRange {
            schema: writer_file.to_owned(),
            field: e.field,
            value: e.value,
            min: *e.allowed.start(),
            max: *e.allowed.end(),
        })?;
        Ok(data)
    }

    /// The first number outside what Herald can act on, as (field, value,
    /// the allowed range): a record is data from outside this process, and a
    /// negative size or a timestamp a thousand years out would otherwise
    /// reach sums, guards and columns unchecked.
    fn check_ranges(&self) -> Result<(), OutOfRange> {
        Ok(())
    }
}

/// A field whose value is outside what Herald accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfRange {
    pub field: &'static str,
    pub value: i64,
    pub allowed: RangeInclusive<i64>,
}

/// Epoch milliseconds Herald accepts in a record: from 1970 to the year 3000.
pub const TIME_MS: RangeInclusive<i64> = 0..=32_503_680_000_000;
/// Business versions: non-negative and exact as a JSON number.
pub const VERSION: RangeInclusive<i64> = 0..=(1 << 53);
/// Result sizes: up to 1 TiB, so a day's counter of one caller and format
/// holds millions of them before its 64-bit sum could overflow.
pub const SIZE_BYTES: RangeInclusive<i64> = 0..=(1 << 40);
/// Attempts of one job.
pub const ATTEMPTS: RangeInclusive<i64> = 0..=1_000_000;

/// `Err` naming `field` when `value` is outside `allowed`.
fn within(field: &'static str, value: i64, allowed: RangeInclusive<i64>) -> Result<(), OutOfRange> {
    if allowed.contains(&value) { Ok(()) } else { Err(OutOfRange { field, value, allowed }) }
}

/// The first field of the writer's record whose bytes do not decode, so the
/// error names it (apache-avro's own message does not). Only on the error path.
/// apache-avro 0.21 decodes a string cut short by the end of input as null
/// instead of failing, so a null where the schema has none counts as broken.
fn failing_field(writer: &Schema, bytes: &[u8]) -> Option<String> {
    let Schema::Record(record) = writer else {
        return None;
    };
    let mut input = bytes;
    record
        .fields
        .iter()
        .find(|f| match datum_reader(&f.schema, None).and_then(|reader| reader.read_value(&mut input)) {
            Err(_) => true,
            Ok(apache_avro::types::Value::Null) => !matches!(f.schema, Schema::Null | Schema::Union(_)),
            Ok(_) => false,
        })
        .map(|f| f.name.clone())
}

/// The common case: a datum of an embedded schema read into a type of the
/// same schema, straight into `T` with the reader kept for that schema (no
/// generic value between, no resolving of the schema again). `None` for
/// anything else, and whenever this read fails: apache-avro's direct read
/// also refuses a type whose serde name is not the schema's record name,
/// which the generic way reads fine.
fn read_direct<T: DeserializeOwned>(writer: &Schema, file: &str, input: &mut &[u8]) -> Option<T> {
    let reader = embedded_reader(writer, file)?;
    let mut attempt = *input;
    let data = reader.read_deser(&mut attempt).ok()?;
    *input = attempt;
    Some(data)
}

/// A reader of data written with `writer`, resolved into `reader` if given.
/// Building one resolves the schemas' names, which costs more than reading
/// a small datum: the hot path keeps one per embedded schema instead.
pub(crate) fn datum_reader<'s>(writer: &'s Schema, reader: Option<&'s Schema>) -> Result<GenericDatumReader<'s>, apache_avro::Error> {
    GenericDatumReader::builder(writer).maybe_reader_schema(reader).build()
}

/// The process's reader of `file` when `writer` is the schema compiled into
/// this build under that name (a registry shares those, and never replaces
/// them); `None` for a schema deployed after the build.
pub(crate) fn embedded_reader(writer: &Schema, file: &str) -> Option<&'static GenericDatumReader<'static>> {
    static READERS: OnceLock<BTreeMap<&'static str, GenericDatumReader<'static>>> = OnceLock::new();
    let readers = READERS.get_or_init(|| {
        schema::FILES.iter().filter_map(|(file, _)| Some((*file, datum_reader(schema::by_file(file).ok()?, None).ok()?))).collect()
    });
    let embedded = schema::by_file(file).ok()?;
    if std::ptr::eq(embedded, writer) { readers.get(file) } else { None }
}

/// `herald.export.requested`: the command a worker acts on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportRequested {
    pub job_id: String,
    pub caller: String,
    pub format: String,
    pub query: String,
    pub requested_at_ms: i64,
    pub version: i64,
}

impl EventData for ExportRequested {
    const EVENT_TYPE: &'static str = "herald.export.requested";
    const SCHEMA_FILE: &'static str = "export.requested.v1.avsc";

    fn check_ranges(&self) -> Result<(), OutOfRange> {
        within("requested_at_ms", self.requested_at_ms, TIME_MS)?;
        within("version", self.version, VERSION)
    }
}

/// `herald.export.completed`: the fact three downstreams build on. Written
/// with v2; data of v1 writers reads with `content_type` at its default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportCompleted {
    pub job_id: String,
    pub caller: String,
    pub format: String,
    pub query: String,
    pub result_id: String,
    pub size_bytes: i64,
    pub sha256: String,
    pub completed_at_ms: i64,
    pub version: i64,
    /// Media type of the result file (v2). The serde default lets a legacy
    /// JSON envelope written before v2 decode too.
    #[serde(default = "default_content_type")]
    pub content_type: String,
}

/// The v2 schema's default of `content_type`.
pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

fn default_content_type() -> String {
    DEFAULT_CONTENT_TYPE.to_owned()
}

impl EventData for ExportCompleted {
    const EVENT_TYPE: &'static str = "herald.export.completed";
    const SCHEMA_FILE: &'static str = "export.completed.v2.avsc";

    fn check_ranges(&self) -> Result<(), OutOfRange> {
        within("size_bytes", self.size_bytes, SIZE_BYTES)?;
        within("completed_at_ms", self.completed_at_ms, TIME_MS)?;
        within("version", self.version, VERSION)
    }
}

/// `herald.export.completed` as a consumer built before v2 reads it. Kept so
/// both directions of the v1/v2 overlap stay tested against real data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportCompletedV1 {
    pub job_id: String,
    pub caller: String,
    pub format: String,
    pub query: String,
    pub result_id: String,
    pub size_bytes: i64,
    pub sha256: String,
    pub completed_at_ms: i64,
    pub version: i64,
}

impl EventData for ExportCompletedV1 {
    const EVENT_TYPE: &'static str = "herald.export.completed";
    const SCHEMA_FILE: &'static str = "export.completed.v1.avsc";

    fn check_ranges(&self) -> Result<(), OutOfRange> {
        within("size_bytes", self.size_bytes, SIZE_BYTES)?;
        within("completed_at_ms", self.completed_at_ms, TIME_MS)?;
        within("version", self.version, VERSION)
    }
}

/// `herald.export.failed`: the job spent its attempt budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportFailed {
    pub job_id: String,
    pub caller: String,
    pub format: String,
    pub query: String,
    pub reason: String,
    pub attempts: i64,
    pub failed_at_ms: i64,
    pub version: i64,
}

impl EventData for ExportFailed {
    const EVENT_TYPE: &'static str = "herald.export.failed";
    const SCHEMA_FILE: &'static str = "export.failed.v1.avsc";

    fn check_ranges(&self) -> Result<(), OutOfRange> {
        within("attempts", self.attempts, ATTEMPTS)?;
        within("failed_at_ms", self.failed_at_ms, TIME_MS)?;
        within("version", self.version, VERSION)
    }
}

/// `herald.export.deleted`: the job and its result are gone. The schema is
/// released ahead of the delete operation that will emit it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportDeleted {
    pub job_id: String,
    pub caller: String,
    pub deleted_at_ms: i64,
    pub version: i64,
}

impl EventData for ExportDeleted {
    const EVENT_TYPE: &'static str = "herald.export.deleted";
    const SCHEMA_FILE: &'static str = "export.deleted.v1.avsc";

    fn check_ranges(&self) -> Result<(), OutOfRange> {
        within("deleted_at_ms", self.deleted_at_ms, TIME_MS)?;
        within("version", self.version, VERSION)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completed() -> ExportCompleted {
        ExportCompleted {
            job_id: "j1".into(),
            caller: "alice".into(),
            format: "csv".into(),
            query: "invoices 2026".into(),
            result_id: "exports/j1/1.csv".into(),
            size_bytes: 42,
            sha256: "ab".repeat(32),
            completed_at_ms: 1_700_000_000_000,
            version: 2,
            content_type: "text/csv".into(),
        }
    }

    fn v1_of(c: &ExportCompleted) -> ExportCompletedV1 {
        ExportCompletedV1 {
            job_id: c.job_id.clone(),
            caller: c.caller.clone(),
            format: c.format.clone(),
            query: c.query.clone(),
            result_id: c.result_id.clone(),
            size_bytes: c.size_bytes,
            sha256: c.sha256.clone(),
            completed_at_ms: c.completed_at_ms,
            version: c.version,
        }
    }

    #[test]
    fn v1_reader_reads_v2_data_without_the_new_field() {
        let bytes = completed().to_avro().unwrap();
        let v1 = ExportCompletedV1::from_avro(ExportCompleted::SCHEMA_FILE, &bytes).unwrap();
        assert_eq!(v1, v1_of(&completed()));
    }

    #[test]
    fn v2_reader_reads_v1_data_with_the_default() {
        let bytes = v1_of(&completed()).to_avro().unwrap();
        let v2 = ExportCompleted::from_avro(ExportCompletedV1::SCHEMA_FILE, &bytes).unwrap();
        assert_eq!(v2, ExportCompleted { content_type: DEFAULT_CONTENT_TYPE.into(), ..completed() });
    }

    #[test]
    fn a_huge_claimed_length_is_refused_before_allocating() {
        // job_id claims 1 GiB (zig-zag varint of 2^30), then the input ends.
        let bytes = [0x80, 0x80, 0x80, 0x80, 0x08];
        let err = ExportCompleted::from_avro(ExportCompleted::SCHEMA_FILE, &bytes).unwrap_err().to_string();
        assert!(err.contains("allocate") && err.contains("field `job_id`"), "{err}");
        assert_eq!(apache_avro::util::max_allocation_bytes(0), MAX_AVRO_ALLOCATION);
    }

    #[test]
    fn a_number_out_of_range_is_refused_naming_its_field() {
        let cases = [
            ("size_bytes", ExportCompleted { size_bytes: i64::MAX, ..completed() }),
            ("size_bytes", ExportCompleted { size_bytes: -1, ..completed() }),
            ("completed_at_ms", ExportCompleted { completed_at_ms: -5, ..completed() }),
            ("completed_at_ms", ExportCompleted { completed_at_ms: 253_402_300_800_000, ..completed() }),
            ("version", ExportCompleted { version: i64::MAX, ..completed() }),
        ];
        for (field, data) in cases {
            let bytes = data.to_avro().unwrap();
            match ExportCompleted::from_avro(ExportCompleted::SCHEMA_FILE, &bytes) {
                Err(EnvelopeError::OutOfRange { field: named, .. }) => assert_eq!(named, field),
                other => panic!("{field}: expected out of range, got {other:?}"),
            }
            // A v1 reader refuses it as well.
            assert!(matches!(ExportCompletedV1::from_avro(ExportCompleted::SCHEMA_FILE, &bytes), Err(EnvelopeError::OutOfRange { .. })));
        }
        let deleted = ExportDeleted { job_id: "j".into(), caller: "c".into(), deleted_at_ms: -1, version: 1 };
        let err = ExportDeleted::from_avro(ExportDeleted::SCHEMA_FILE, &deleted.to_avro().unwrap()).unwrap_err().to_string();
        assert!(err.contains("field `deleted_at_ms` out of range: -1"), "{err}");
        let limits = ExportCompleted { size_bytes: 1 << 40, completed_at_ms: 0, version: 0, ..completed() };
        assert_eq!(ExportCompleted::from_avro(ExportCompleted::SCHEMA_FILE, &limits.to_avro().unwrap()).unwrap(), limits);
    }

    #[test]
    fn deleted_round_trips() {
        let d = ExportDeleted { job_id: "j".into(), caller: "c".into(), deleted_at_ms: 7, version: 4 };
        assert_eq!(ExportDeleted::from_avro(ExportDeleted::SCHEMA_FILE, &d.to_avro().unwrap()).unwrap(), d);
    }

    #[test]
    fn completed_round_trips_through_avro() {
        let bytes = completed().to_avro().unwrap();
        let back = ExportCompleted::from_avro(ExportCompleted::SCHEMA_FILE, &bytes).unwrap();
        assert_eq!(back, completed());
    }

    #[test]
    fn truncated_datum_is_a_typed_error() {
        let bytes = completed().to_avro().unwrap();
        let err = ExportCompleted::from_avro(ExportCompleted::SCHEMA_FILE, &bytes[..5]).unwrap_err();
        assert!(matches!(err, EnvelopeError::Data { .. }), "{err}");
        // "j1" and "alice" fit in 5 bytes only partly: the caller is cut off.
        assert!(err.to_string().contains("field `caller`"), "{err}");
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut bytes = completed().to_avro().unwrap();
        bytes.push(0);
        assert!(ExportCompleted::from_avro(ExportCompleted::SCHEMA_FILE, &bytes).is_err());
    }

    /// The resolved reader is kept for the schemas of this build only: a
    /// schema parsed elsewhere (deployed after the build) under an embedded
    /// name gets its own reader, and reads the same.
    #[test]
    fn the_kept_reader_is_the_embedded_schemas_and_another_reads_the_same() {
        let file = ExportCompleted::SCHEMA_FILE;
        let registry = crate::Registry::embedded();
        let shared = registry.get(file).unwrap();
        assert!(embedded_reader(shared, file).is_some());
        let text = schema::FILES.iter().find(|(f, _)| *f == file).unwrap().1;
        let parsed = Schema::parse_str(text).unwrap();
        assert!(embedded_reader(&parsed, file).is_none());
        assert!(embedded_reader(shared, ExportCompletedV1::SCHEMA_FILE).is_none(), "the name must match the schema");
        let bytes = completed().to_avro().unwrap();
        assert_eq!(ExportCompleted::from_avro_with(&parsed, file, &bytes).unwrap(), completed());
        assert_eq!(ExportCompleted::from_avro_with(shared, file, &bytes).unwrap(), completed());
    }

    /// apache-avro's direct read refuses a type whose serde name is not the
    /// schema's record name (`ExportCompletedV1` for `ExportCompleted`); such
    /// a datum is read the general way, and bad data still names its field.
    #[test]
    fn a_type_named_unlike_its_record_still_reads_its_own_schema() {
        let v1 = v1_of(&completed());
        let bytes = v1.to_avro().unwrap();
        assert_eq!(ExportCompletedV1::from_avro(ExportCompletedV1::SCHEMA_FILE, &bytes).unwrap(), v1);
        let err = ExportCompletedV1::from_avro(ExportCompletedV1::SCHEMA_FILE, &bytes[..5]).unwrap_err();
        assert!(err.to_string().contains("field `caller`"), "{err}");
    }
}
