//! Typed event data and its Avro binary codec (one datum, no container header).

use apache_avro::{from_avro_datum, from_value, to_avro_datum, to_value};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::{EnvelopeError, schema};

/// Data of one event type, written with one schema file.
pub trait EventData: Serialize + DeserializeOwned {
    /// CloudEvents `type`.
    const EVENT_TYPE: &'static str;
    /// The file under `schemas/` this data is written with.
    const SCHEMA_FILE: &'static str;

    /// Avro binary encoding of this datum.
    fn to_avro(&self) -> Result<Vec<u8>, EnvelopeError> {
        let schema = schema::by_file(Self::SCHEMA_FILE)?;
        let err = |reason: String| EnvelopeError::Data {
            schema: Self::SCHEMA_FILE.to_owned(),
            reason,
        };
        let value = to_value(self).map_err(|e| err(e.to_string()))?;
        to_avro_datum(schema, value).map_err(|e| err(e.to_string()))
    }

    /// Decodes `bytes` written with `writer_file` into this type.
    fn from_avro(writer_file: &str, bytes: &[u8]) -> Result<Self, EnvelopeError> {
        let writer = schema::by_file(writer_file)?;
        // Resolution is only needed across schema versions, and it is costly
        // (it walks both schemas on every call): skip it for the same file.
        let reader = if writer_file == Self::SCHEMA_FILE { None } else { Some(schema::by_file(Self::SCHEMA_FILE)?) };
        let err = |reason: String| EnvelopeError::Data {
            schema: writer_file.to_owned(),
            reason,
        };
        let mut input = bytes;
        let value =
            from_avro_datum(writer, &mut input, reader).map_err(|e| err(e.to_string()))?;
        if !input.is_empty() {
            return Err(err(format!("{} trailing bytes after the datum", input.len())));
        }
        from_value(&value).map_err(|e| err(e.to_string()))
    }
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
}

/// `herald.export.completed`: the fact three downstreams build on.
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
}

impl EventData for ExportCompleted {
    const EVENT_TYPE: &'static str = "herald.export.completed";
    const SCHEMA_FILE: &'static str = "export.completed.v1.avsc";
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
        }
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
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut bytes = completed().to_avro().unwrap();
        bytes.push(0);
        assert!(ExportCompleted::from_avro(ExportCompleted::SCHEMA_FILE, &bytes).is_err());
    }
}
