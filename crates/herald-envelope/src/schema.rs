//! The schemas of event data. The ones this build writes and reads are
//! compiled in, so a running Herald never depends on a file lying next to it;
//! a [`Registry`] adds schemas deployed after the build.
//!
//! "Deployed" is explicit: a consumer reads with the registry it was built
//! with. A record whose `dataschema` names a schema that registry lacks is
//! dead-lettered with reason `unknown schema <file>`; once a registry with that
//! schema is in place, redriving the letter applies it.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use apache_avro::Schema;

use crate::EnvelopeError;
use crate::compat::parse_file_name;
use crate::trust::Sources;

/// Prefix of a `dataschema` value; the rest is the file name under `schemas/`.
pub const DATASCHEMA_PREFIX: &str = "herald:schemas/";

/// Every schema file this build can read and write, by file name. Every
/// version stays: a consumer must read data of any version still on a topic.
pub const FILES: &[(&str, &str)] = &[
    ("export.requested.v1.avsc", include_str!("../../../schemas/export.requested.v1.avsc")),
    ("export.completed.v1.avsc", include_str!("../../../schemas/export.completed.v1.avsc")),
    ("export.completed.v2.avsc", include_str!("../../../schemas/export.completed.v2.avsc")),
    ("export.failed.v1.avsc", include_str!("../../../schemas/export.failed.v1.avsc")),
    ("export.deleted.v1.avsc", include_str!("../../../schemas/export.deleted.v1.avsc")),
];

/// The writer schemas a process knows, by file name, and the sources whose
/// records it accepts ([`Sources`]; Herald's own unless told otherwise).
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct Registry {
    schemas: Arc<BTreeMap<String, Arc<Schema>>>,
    sources: Sources,
}

impl Registry {
    /// The schemas compiled into this build.
    pub fn embedded() -> Registry {
        static EMBEDDED: OnceLock<Registry> = OnceLock::new();
        EMBEDDED
            .get_or_init(|| {
                let schemas = FILES
                    .iter()
                    .map(|(name, text)| {
                        // The files are part of this build; a parse failure is a build
                        // defect that the schema tests catch before anything ships.
                        let schema = Schema::parse_str(text).unwrap_or_else(|e| panic!("schemas/{name} does not parse: {e}"));
                        ((*name).to_owned(), Arc::new(schema))
                    })
                    .collect();
                Registry { schemas: Arc::new(schemas), sources: Sources::herald() }
            })
            .clone()
    }

    /// This registry accepting records from `sources` instead.
    pub fn accepting(mut self, sources: Sources) -> Registry {
        self.sources = sources;
        self
    }

    pub fn sources(&self) -> &Sources {
        &self.sources
    }

    /// This registry plus `file` (named `<subject>.v<N>.avsc`) with schema `text`.
    /// A file already known is refused: released schema files never change.
    pub fn with_schema(&self, file: &str, text: &str) -> Result<Registry, EnvelopeError> {
        let bad = |reason: String| EnvelopeError::BadSchema { file: file.to_owned(), reason };
        if parse_file_name(file).is_none() {
            return Err(bad("not named <subject>.v<N>.avsc".to_owned()));
        }
        if self.schemas.contains_key(file) {
            return Err(bad("already known; released schema files never change".to_owned()));
        }
        let schema = Schema::parse_str(text).map_err(|e| bad(e.to_string()))?;
        let mut schemas = (*self.schemas).clone();
        schemas.insert(file.to_owned(), Arc::new(schema));
        Ok(Registry { schemas: Arc::new(schemas), sources: self.sources.clone() })
    }

    /// The schema of `file`, or `unknown schema <file>`.
    pub fn get(&self, file: &str) -> Result<&Arc<Schema>, EnvelopeError> {
        self.schemas.get(file).ok_or_else(|| EnvelopeError::UnknownSchema(file.to_owned()))
    }

    pub fn files(&self) -> impl Iterator<Item = &str> {
        self.schemas.keys().map(String::as_str)
    }
}

/// The parsed schema of a file compiled into this build.
pub fn by_file(file: &str) -> Result<&'static Schema, EnvelopeError> {
    static EMBEDDED: OnceLock<Registry> = OnceLock::new();
    let registry = EMBEDDED.get_or_init(Registry::embedded);
    registry.schemas.get(file).map(|s| &**s).ok_or_else(|| EnvelopeError::UnknownSchema(file.to_owned()))
}

/// The `dataschema` URI naming `file`.
pub fn dataschema_uri(file: &str) -> String {
    format!("{DATASCHEMA_PREFIX}{file}")
}

/// The schema file named by a `dataschema` URI.
pub fn file_of_dataschema(uri: &str) -> Result<&str, EnvelopeError> {
    uri.strip_prefix(DATASCHEMA_PREFIX).filter(|file| !file.is_empty()).ok_or_else(|| EnvelopeError::UnknownSchema(uri.to_owned()))
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

    /// A schema file added to `schemas/` but not compiled in would pass the
    /// compatibility check and still be unknown to every consumer.
    #[test]
    fn every_file_in_schemas_dir_is_embedded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".avsc"))
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = FILES.iter().map(|(n, _)| (*n).to_owned()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded);
        for (name, text) in FILES {
            assert_eq!(std::fs::read_to_string(dir.join(name)).unwrap(), *text, "{name}");
        }
    }

    #[test]
    fn unknown_file_is_named_in_the_error() {
        let err = by_file("export.completed.v9.avsc").unwrap_err();
        assert_eq!(err.to_string(), "unknown schema export.completed.v9.avsc");
    }

    #[test]
    fn a_deployed_schema_is_known_to_its_registry_only() {
        let text = FILES[1].1;
        let base = Registry::embedded();
        let deployed = base.with_schema("export.completed.v9.avsc", text).unwrap();
        assert!(deployed.get("export.completed.v9.avsc").is_ok());
        assert!(base.get("export.completed.v9.avsc").is_err());
        assert!(base.with_schema("export.completed.v1.avsc", text).is_err(), "released files never change");
        assert!(base.with_schema("nonsense", text).is_err());
        assert!(base.with_schema("x.v1.avsc", "{").is_err());
    }

    #[test]
    fn dataschema_round_trips_to_the_file_name() {
        let uri = dataschema_uri("export.completed.v1.avsc");
        assert_eq!(file_of_dataschema(&uri).unwrap(), "export.completed.v1.avsc");
        assert!(file_of_dataschema("https://example.test/x.avsc").is_err());
    }
}
