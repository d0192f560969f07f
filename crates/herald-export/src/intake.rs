//! What a caller may ask for, and when two asks are the same ask.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ExportError;

/// Longest accepted query text, in bytes.
pub const MAX_QUERY_BYTES: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

/// A validated export request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportRequest {
    pub format: Format,
    pub query: String,
}

impl ExportRequest {
    /// Parses and validates a JSON body; every failure names the field.
    pub fn from_json(body: &[u8]) -> Result<ExportRequest, ExportError> {
        let request: ExportRequest =
            serde_json::from_slice(body).map_err(|e| ExportError::Invalid(e.to_string()))?;
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

    #[test]
    fn invalid_bodies_name_the_problem() {
        for (body, needle) in [
            (&br#"{"format":"xml","query":"q"}"#[..], "unknown variant"),
            (br#"{"format":"csv","query":"  "}"#, "query"),
            (br#"{"format":"csv"}"#, "query"),
            (br#"{"format":"csv","query":"q","extra":1}"#, "extra"),
            (b"not json", "expected"),
        ] {
            let err = ExportRequest::from_json(body).unwrap_err().to_string();
            assert!(err.contains(needle), "{err} should mention {needle}");
        }
    }
}
