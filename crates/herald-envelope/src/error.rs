use thiserror::Error;

/// Why a record or a datum could not be turned into a Herald event.
///
/// Every variant is permanent for the bytes at hand: retrying the same record
/// gives the same answer, so a consumer dead-letters it instead of retrying.
#[derive(Debug, Error)]
pub enum EnvelopeError {
    /// The record is not a valid CloudEvent in Kafka binary mode.
    #[error("not a CloudEvent in Kafka binary mode: {0}")]
    NotCloudEvent(String),
    /// A required attribute is absent or empty.
    #[error("attribute `{0}` is missing")]
    MissingAttribute(&'static str),
    /// An attribute is present but has a value Herald does not accept.
    #[error("attribute `{name}` is invalid: {reason}")]
    InvalidAttribute { name: &'static str, reason: String },
    /// `dataschema` names a schema this build does not know.
    #[error("unknown schema {0}")]
    UnknownSchema(String),
    /// A schema handed to a registry is unusable: fix the file, nothing to retry.
    #[error("schema {file} is unusable: {reason}")]
    BadSchema { file: String, reason: String },
    /// No `ce_*` headers, and the value is not a valid legacy envelope.
    #[error("{0}")]
    Legacy(String),
    /// The data does not decode (or encode) with the named schema.
    #[error("data does not match schema {schema}: {reason}")]
    Data { schema: String, reason: String },
    /// The record's source is not among those this consumer accepts
    /// (`--accept-source`): a stranger's record, refused whatever it says.
    #[error("untrusted source `{0}`: not among the sources this subscription accepts (--accept-source)")]
    UntrustedSource(String),
    /// A number decoded fine but is outside what Herald can act on (a
    /// negative size, a timestamp in the year 9999).
    #[error("data of schema {schema}: field `{field}` out of range: {value} (allowed {min}..={max})")]
    OutOfRange { schema: String, field: &'static str, value: i64, min: i64, max: i64 },
}
