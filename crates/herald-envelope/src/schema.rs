//! The schemas of event data. The ones this build writes and reads are
//! compiled in, so a running Herald never depends on a file lying next to it;
//! a [`Registry`] adds schemas deployed after the build.
//!
//! "Deployed" is explicit: a consumer reads with the registry it was built
//! with. A record whose `dataschema` names a schema that registry lacks is
//! dead-lettered with reason `unknown schema <file>`; once a registry with that
//! schema is in place, redriving the letter applies it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use apache_avro::Schema;

use crate::EnvelopeError;
use crate::compat::{COMPATIBILITY_FILE, Compatibility, check_rules, parse_file_name};
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
    /// Each file's text as written, for serving it (`GET /schemas/{file}`).
    texts: Arc<BTreeMap<String, Arc<str>>>,
    sources: Sources,
}

/// `schemas/compatibility.toml` of this build: the modes of Herald's own
/// subjects, which a deployed directory is checked under too.
pub const COMPATIBILITY: &str = include_str!("../../../schemas/compatibility.toml");

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
                let texts = FILES.iter().map(|(name, text)| ((*name).to_owned(), Arc::from(*text))).collect();
                Registry { schemas: Arc::new(schemas), texts: Arc::new(texts), sources: Sources::herald() }
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
        let mut texts = (*self.texts).clone();
        texts.insert(file.to_owned(), Arc::from(text));
        Ok(Registry { schemas: Arc::new(schemas), texts: Arc::new(texts), sources: self.sources.clone() })
    }

    /// This registry plus every `<subject>.v<N>.avsc` of `dir`: schemas
    /// deployed after the build, so a new event type or version needs no
    /// rebuild. The union must pass the compatibility check under this
    /// build's modes and the directory's own `compatibility.toml` (if any,
    /// its entries win); a file this registry already has must be identical.
    pub fn with_dir(&self, dir: &Path) -> Result<Registry, EnvelopeError> {
        let bad = |reason: String| EnvelopeError::BadSchema { file: dir.display().to_string(), reason };
        let entries = std::fs::read_dir(dir).map_err(|e| bad(e.to_string()))?;
        let mut deployed = Vec::new();
        for entry in entries {
            let path = entry.map_err(|e| bad(e.to_string()))?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()).filter(|n| n.ends_with(".avsc")).map(str::to_owned) else {
                continue;
            };
            let text = std::fs::read_to_string(&path).map_err(|e| bad(format!("{name}: {e}")))?;
            deployed.push((name, text));
        }
        deployed.sort();
        let own_rules = match std::fs::read_to_string(dir.join(COMPATIBILITY_FILE)) {
            Ok(text) => Some(Compatibility::parse(&text).map_err(|e| bad(e.to_string()))?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(bad(format!("{COMPATIBILITY_FILE}: {e}"))),
        };
        let mut registry = self.clone();
        for (name, text) in &deployed {
            match self.texts.get(name) {
                Some(known) if known.as_ref() == text => {}
                Some(_) => return Err(bad(format!("{name} differs from the released file of that name; released files never change"))),
                None => registry = registry.with_schema(name, text)?,
            }
        }
        let mut rules = Compatibility::parse(COMPATIBILITY).map_err(|e| bad(e.to_string()))?;
        if let Some(own) = own_rules {
            rules.default = own.default;
            rules.subjects.extend(own.subjects);
        }
        let all: Vec<(String, String)> = registry.texts.iter().map(|(n, t)| (n.clone(), t.to_string())).collect();
        let report = check_rules(&all, &rules).map_err(|e| bad(e.to_string()))?;
        if !report.violations.is_empty() {
            return Err(bad(format!("incompatible with the schemas before it: {}", report.violations.join("; "))));
        }
        Ok(registry)
    }

    /// The text of `file` as it was written, if known.
    pub fn text(&self, file: &str) -> Option<&str> {
        self.texts.get(file).map(|t| &**t)
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

/// The `dataschema` naming `file`: under `base` (an absolute URL ending in
/// `/`, where `GET /schemas/{file}` serves it) when one is configured.
pub fn dataschema_under(base: Option<&str>, file: &str) -> String {
    match base {
        Some(base) => format!("{base}{file}"),
        None => dataschema_uri(file),
    }
}

/// The schema file named by a `dataschema` URI: `herald:schemas/<file>`, or
/// an http(s) URL whose last path segment is a `<subject>.v<N>.avsc` file
/// (Herald's `GET /schemas/{file}` under any base). The name is the
/// identity: a consumer reads with the schema of that name it knows and
/// never fetches the URL.
pub fn file_of_dataschema(uri: &str) -> Result<&str, EnvelopeError> {
    let unknown = || EnvelopeError::UnknownSchema(uri.to_owned());
    if let Some(file) = uri.strip_prefix(DATASCHEMA_PREFIX) {
        return Some(file).filter(|file| !file.is_empty()).ok_or_else(unknown);
    }
    if !(uri.starts_with("https://") || uri.starts_with("http://")) {
        return Err(unknown());
    }
    let path = uri.split(['?', '#']).next().unwrap_or_default();
    let file = path.rsplit('/').next().unwrap_or_default();
    parse_file_name(file).map(|_| file).ok_or_else(unknown)
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
        assert!(file_of_dataschema("ftp://example.test/schemas/export.completed.v1.avsc").is_err());
        let under = dataschema_under(Some("https://herald.example/schemas/"), "export.completed.v1.avsc");
        assert_eq!(file_of_dataschema(&under).unwrap(), "export.completed.v1.avsc");
    }

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    const ORDER_V1: &str = r#"{"type":"record","name":"OrderPlaced","namespace":"shop","fields":[{"name":"order_id","type":"string"}]}"#;

    #[test]
    fn a_directory_adds_new_subjects_and_versions_checked_with_the_embedded_ones() {
        let added = r#"{"type":"record","name":"OrderPlaced","namespace":"shop","fields":[{"name":"order_id","type":"string"},{"name":"cents","type":"long","default":0}]}"#;
        let dir = dir_with(&[("shop.order.placed.v1.avsc", ORDER_V1), ("shop.order.placed.v2.avsc", added), (FILES[1].0, FILES[1].1)]);
        let registry = Registry::embedded().with_dir(dir.path()).unwrap();
        assert!(registry.get("shop.order.placed.v2.avsc").is_ok());
        assert_eq!(registry.text("shop.order.placed.v1.avsc"), Some(ORDER_V1));
        assert_eq!(registry.text(FILES[0].0), Some(FILES[0].1), "the embedded ones stay");
    }

    #[test]
    fn a_directory_that_breaks_compatibility_or_a_released_file_is_refused() {
        // v2 drops a field without a default: old data no longer reads (backward).
        let breaking = r#"{"type":"record","name":"OrderPlaced","namespace":"shop","fields":[{"name":"id","type":"long"}]}"#;
        let dir = dir_with(&[("shop.order.placed.v1.avsc", ORDER_V1), ("shop.order.placed.v2.avsc", breaking)]);
        let err = Registry::embedded().with_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains("incompatible"), "{err}");
        let changed = dir_with(&[(FILES[1].0, ORDER_V1)]);
        let err = Registry::embedded().with_dir(changed.path()).unwrap_err().to_string();
        assert!(err.contains("released files never change"), "{err}");
        assert!(Registry::embedded().with_dir(Path::new("/no/such/dir")).is_err());
    }
}
