//! The schemas of event data, compiled into the binary so that a running
//! Herald never depends on a file lying next to it.

use std::sync::OnceLock;

use apache_avro::Schema;

use crate::EnvelopeError;

/// Prefix of a `dataschema` value; the rest is the file name under `schemas/`.
pub const DATASCHEMA_PREFIX: &str = "herald:schemas/";

/// Every schema file this build can read and write, by file name.
const FILES: &[(&str, &str)] = &[
    (
        "export.requested.v1.avsc",
        include_str!("../../../schemas/export.requested.v1.avsc"),
    ),
    (
        "export.completed.v1.avsc",
        include_str!("../../../schemas/export.completed.v1.avsc"),
    ),
    (
        "export.failed.v1.avsc",
        include_str!("../../../schemas/export.failed.v1.avsc"),
    ),
];

/// The parsed schema of a file under `schemas/`.
pub fn by_file(file: &str) -> Result<&'static Schema, EnvelopeError> {
    static PARSED: OnceLock<Vec<(&'static str, Schema)>> = OnceLock::new();
    let parsed = PARSED.get_or_init(|| {
        FILES
            .iter()
            .map(|(name, text)| {
                // The files are part of this build; a parse failure is a build defect
                // that the schema tests catch before anything ships.
                let schema = Schema::parse_str(text)
                    .unwrap_or_else(|e| panic!("schemas/{name} does not parse: {e}"));
                (*name, schema)
            })
            .collect()
    });
    parsed
        .iter()
        .find(|(name, _)| *name == file)
        .map(|(_, schema)| schema)
        .ok_or_else(|| EnvelopeError::UnknownSchema(file.to_owned()))
}

/// The `dataschema` URI naming `file`.
pub fn dataschema_uri(file: &str) -> String {
    format!("{DATASCHEMA_PREFIX}{file}")
}

/// The schema file named by a `dataschema` URI.
pub fn file_of_dataschema(uri: &str) -> Result<&str, EnvelopeError> {
    uri.strip_prefix(DATASCHEMA_PREFIX)
        .filter(|file| !file.is_empty())
        .ok_or_else(|| EnvelopeError::UnknownSchema(uri.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_file_parses() {
        for (file, _) in FILES {
            assert!(by_file(file).is_ok(), "{file}");
        }
    }

    #[test]
    fn unknown_file_is_named_in_the_error() {
        let err = by_file("export.completed.v9.avsc").unwrap_err();
        assert_eq!(err.to_string(), "unknown schema export.completed.v9.avsc");
    }

    #[test]
    fn dataschema_round_trips_to_the_file_name() {
        let uri = dataschema_uri("export.completed.v1.avsc");
        assert_eq!(file_of_dataschema(&uri).unwrap(), "export.completed.v1.avsc");
        assert!(file_of_dataschema("https://example.test/x.avsc").is_err());
    }
}
