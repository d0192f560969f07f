//! What a caller may ask for, and when two asks are the same ask.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ExportError;

/// Longest accepted query text, in bytes.
pub const MAX_QUERY_BYTES: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Csv,
    Json,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Json => "json",
        }
    }

    pub fn parse(s: &str) -> Result<Format, ExportError> {
        match s {
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::Json),
            other => Err(ExportError::Invalid(format!("format `{other}` is not one of csv, json"))),
        }
    }
}

/// A validated export request: the body of `POST /v1/exports`.
// Its schema states what `from_json` checks, as far as JSON Schema can:
// `maxLength` counts characters, not bytes, so it admits some multi-byte
// texts that are rejected; nothing it rejects is accepted. The derive takes
// literals only: a test compares them with the constants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportRequest {
    pub format: Format,
    /// Text to export: at most 4096 bytes of UTF-8, no control characters,
    /// at least one character that is not white space.
    #[schema(
        min_length = 1,
        max_length = 4096,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]*[^\u0000-\u0020\u007F-\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000][^\u0000-\u001F\u007F-\u009F]*$"
    )]
    pub query: String,
}

impl ExportRequest {
    /// Parses and validates a JSON body; every failure names the field.
    /// Field by field rather than with the derived `Deserialize`, whose
    /// messages ("unknown variant `xml`", "invalid type: integer") do not say
    /// which field is wrong.
    pub fn from_json(body: &[u8]) -> Result<ExportRequest, ExportError> {
        let invalid = |m: String| ExportError::Invalid(m);
        let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| invalid(format!("body: {e}")))?;
        let serde_json::Value::Object(fields) = value else {
            return Err(invalid("body: expected a JSON object with `format` and `query`".into()));
        };
        if let Some(unknown) = fields.keys().find(|k| !matches!(k.as_str(), "format" | "query")) {
            return Err(invalid(format!("{unknown}: unknown field, expected `format` or `query`")));
        }
        let text = |name: &str| match fields.get(name) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(invalid(format!("{name}: expected a string, got {other}"))),
            None => Err(invalid(format!("{name}: missing field `{name}`"))),
        };
        let format = Format::parse(&text("format")?)?;
        let request = ExportRequest { format, query: text("query")? };
        request.validate()?;
        Ok(request)
    }

    fn validate(&self) -> Result<(), ExportError> {
        if self.query.trim().is_empty() {
            return Err(ExportError::Invalid("query: must not be empty".into()));
        }
        if self.query.len() > MAX_QUERY_BYTES {
            return Err(ExportError::Invalid(format!("query: longer than {MAX_QUERY_BYTES} bytes")));
        }
        if self.query.chars().any(char::is_control) {
            return Err(ExportError::Invalid("query: control characters are not allowed".into()));
        }
        Ok(())
    }

    /// Canonical fingerprint of the parameters: equal requests, equal
    /// fingerprints, whatever the JSON's key order or whitespace.
    pub fn fingerprint(&self) -> String {
        let mut hash = Sha256::new();
        hash.update(self.format.as_str());
        hash.update([0]);
        hash.update(self.query.as_bytes());
        hex(&hash.finalize())
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_parameters_in_another_key_order_share_a_fingerprint() {
        let a = ExportRequest::from_json(br#"{"format":"csv","query":"q"}"#).unwrap();
        let b = ExportRequest::from_json(br#"{ "query": "q", "format": "csv" }"#).unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint());
    }

    #[test]
    fn different_parameters_differ() {
        let a = ExportRequest::from_json(br#"{"format":"csv","query":"q"}"#).unwrap();
        let b = ExportRequest::from_json(br#"{"format":"json","query":"q"}"#).unwrap();
        assert_ne!(a.fingerprint(), b.fingerprint());
    }

    /// The schema's literals are the validation's constants.
    #[test]
    fn schema_states_the_limits() {
        use utoipa::PartialSchema;
        let schema = serde_json::to_value(ExportRequest::schema()).unwrap();
        let query = &schema["properties"]["query"];
        assert_eq!(query["maxLength"], MAX_QUERY_BYTES, "{schema}");
        assert_eq!(query["minLength"], 1, "{schema}");
        assert_eq!(schema["additionalProperties"], false, "deny_unknown_fields: {schema}");
        assert_eq!(schema["properties"]["format"]["$ref"], "#/components/schemas/Format", "{schema}");
    }

    #[test]
    fn invalid_bodies_name_the_problem() {
        for (body, needle) in [
            (&br#"{"format":"xml","query":"q"}"#[..], "format `xml` is not one of csv, json"),
            (br#"{"format":1,"query":"q"}"#, "format: expected a string"),
            (br#"{"format":"csv","query":["q"]}"#, "query: expected a string"),
            (br#"[1]"#, "body: expected a JSON object"),
            (br#"{"format":"csv","query":"  "}"#, "query"),
            (br#"{"format":"csv"}"#, "query"),
            (br#"{"format":"csv","query":"q","extra":1}"#, "extra"),
            (b"not json", "body: expected"),
        ] {
            let err = ExportRequest::from_json(body).unwrap_err().to_string();
            assert!(err.contains(needle), "{err} should mention {needle}");
        }
    }
}
