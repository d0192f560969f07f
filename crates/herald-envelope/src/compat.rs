//! Schema evolution rules: every version of a subject checked against its
//! predecessors under the subject's declared compatibility mode.
//!
//! The rule itself (can data written with schema W be read with schema R?)
//! is `apache-avro`'s [`SchemaCompatibility::can_read`]; this module only
//! decides which pairs to ask about and says the answer in plain words. The
//! library stops at the first problem of a pair, so a record is asked about
//! field by field (a reader record reduced to one field) to name every field
//! that breaks, not just the first. No IO: callers hand in file contents.

use std::collections::BTreeMap;
use std::fmt;

use apache_avro::Schema;
use apache_avro::error::CompatibilityError;
use apache_avro::schema::RecordSchema;
use apache_avro::schema_compatibility::SchemaCompatibility;
use serde::Deserialize;
use thiserror::Error;

use crate::pattern::NamePattern;

/// Name of the file under `schemas/` declaring each subject's mode.
pub const COMPATIBILITY_FILE: &str = "compatibility.toml";

/// Which readers must read which writers, as schema registries define it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The new version reads data of the previous one.
    Backward,
    /// The new version reads data of every earlier one.
    BackwardTransitive,
    /// The previous version reads data of the new one.
    Forward,
    /// Every earlier version reads data of the new one.
    ForwardTransitive,
    /// Backward and forward against the previous version.
    Full,
    /// Backward and forward against every earlier version.
    FullTransitive,
}

impl Mode {
    fn transitive(self) -> bool {
        matches!(self, Mode::BackwardTransitive | Mode::ForwardTransitive | Mode::FullTransitive)
    }
    fn backward(self) -> bool {
        !matches!(self, Mode::Forward | Mode::ForwardTransitive)
    }
    fn forward(self) -> bool {
        !matches!(self, Mode::Backward | Mode::BackwardTransitive)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Backward => "backward",
            Mode::BackwardTransitive => "backward-transitive",
            Mode::Forward => "forward",
            Mode::ForwardTransitive => "forward-transitive",
            Mode::Full => "full",
            Mode::FullTransitive => "full-transitive",
        })
    }
}

fn default_mode() -> Mode {
    Mode::BackwardTransitive
}

/// `compatibility.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compatibility {
    /// Mode of subjects not listed.
    #[serde(default = "default_mode")]
    pub default: Mode,
    #[serde(default)]
    pub subjects: BTreeMap<String, Mode>,
    /// Subjects (exact, or a prefix ending in `*`) whose data must carry the
    /// business `version` (Herald's own, whose search projection orders
    /// facts by it); an application's subjects need not.
    #[serde(default)]
    pub versioned: Vec<String>,
}

impl Compatibility {
    pub fn parse(text: &str) -> Result<Compatibility, CheckInputError> {
        let rules: Compatibility = toml::from_str(text).map_err(|e| CheckInputError::Compatibility(e.to_string()))?;
        for pattern in &rules.versioned {
            NamePattern::parse(pattern).map_err(|reason| CheckInputError::Compatibility(format!("versioned: {reason}")))?;
        }
        Ok(rules)
    }

    pub fn mode_of(&self, subject: &str) -> Mode {
        self.subjects.get(subject).copied().unwrap_or(self.default)
    }

    pub fn is_versioned(&self, subject: &str) -> bool {
        self.versioned.iter().any(|p| NamePattern::parse(p).is_ok_and(|p| p.matches(subject)))
    }
}

/// Input the check cannot work with: fix the files, there is nothing to judge.
#[derive(Debug, Error)]
pub enum CheckInputError {
    #[error("{COMPATIBILITY_FILE}: {0}")]
    Compatibility(String),
    #[error("{0}: not named <subject>.v<N>.avsc (N from 1, no leading zero)")]
    FileName(String),
    #[error("{file} does not parse as an Avro schema: {reason}")]
    Parse { file: String, reason: String },
}

/// One subject's versions, as found.
#[derive(Debug, Clone)]
pub struct Subject {
    pub name: String,
    pub mode: Mode,
    pub versions: Vec<u32>,
}

/// What the check found; no violations means every rule holds.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub subjects: Vec<Subject>,
    /// One plain sentence per incompatibility or broken rule.
    pub violations: Vec<String>,
}

/// `<subject>.v<N>.avsc` → (subject, N).
pub fn parse_file_name(file: &str) -> Option<(&str, u32)> {
    let stem = file.strip_suffix(".avsc")?;
    let (subject, version) = stem.rsplit_once(".v")?;
    let ok = !subject.is_empty() && !version.starts_with('0') && version.bytes().all(|b| b.is_ascii_digit());
    let n: u32 = version.parse().ok().filter(|_| ok)?;
    Some((subject, n))
}

/// Checks the `.avsc` files among `files` (name, content) against
/// `compatibility` (the text of `compatibility.toml`). Other files are ignored.
pub fn check(files: &[(String, String)], compatibility: &str) -> Result<Report, CheckInputError> {
    check_rules(files, &Compatibility::parse(compatibility)?)
}

/// [`check`] with the rules already parsed (merged from several files).
pub fn check_rules(files: &[(String, String)], rules: &Compatibility) -> Result<Report, CheckInputError> {
    let mut by_subject: BTreeMap<String, BTreeMap<u32, Schema>> = BTreeMap::new();
    for (file, text) in files.iter().filter(|(f, _)| f.ends_with(".avsc")) {
        let (subject, version) = parse_file_name(file).ok_or_else(|| CheckInputError::FileName(file.clone()))?;
        let schema = Schema::parse_str(text).map_err(|e| CheckInputError::Parse { file: file.clone(), reason: e.to_string() })?;
        by_subject.entry(subject.to_owned()).or_default().insert(version, schema);
    }
    let mut report = Report::default();
    for listed in rules.subjects.keys().filter(|s| !by_subject.contains_key(*s)) {
        report.violations.push(format!("{COMPATIBILITY_FILE} names subject {listed}, which has no schema files"));
    }
    for (subject, versions) in &by_subject {
        let mode = rules.mode_of(subject);
        check_subject(subject, mode, rules.is_versioned(subject), versions, &mut report.violations);
        report.subjects.push(Subject { name: subject.clone(), mode, versions: versions.keys().copied().collect() });
    }
    Ok(report)
}

fn check_subject(subject: &str, mode: Mode, versioned: bool, versions: &BTreeMap<u32, Schema>, out: &mut Vec<String>) {
    let max = versions.keys().max().copied().unwrap_or(0);
    for missing in (1..=max).filter(|v| !versions.contains_key(v)) {
        out.push(format!(
            "{subject}: v{missing} is missing; released versions are never deleted, so later ones cannot be checked against it"
        ));
    }
    for (&v, schema) in versions {
        if let Some(problem) = version_field_problem(schema).filter(|_| versioned) {
            out.push(format!("{subject} v{v}: {problem}"));
        }
        let earlier: Vec<u32> = versions.keys().copied().filter(|&p| p < v).collect();
        let against: &[u32] = if mode.transitive() { &earlier } else { earlier.last().map_or(&[], std::slice::from_ref) };
        for &p in against {
            let old = &versions[&p];
            if mode.backward() {
                for why in incompatibilities(old, schema) {
                    out.push(format!("{subject} ({mode}): v{v} readers cannot read v{p} data: {}", why.words(p, v)));
                }
            }
            if mode.forward() {
                for why in incompatibilities(schema, old) {
                    out.push(format!("{subject} ({mode}): v{p} readers cannot read v{v} data: {}", why.words(v, p)));
                }
            }
        }
    }
}

/// Every event's data carries the business `version` that orders facts of
/// one subject; a schema without it would let a consumer apply facts out of
/// order without noticing.
fn version_field_problem(schema: &Schema) -> Option<String> {
    let Schema::Record(record) = schema else {
        return Some("event data must be an Avro record".to_owned());
    };
    match record.fields.iter().find(|f| f.name == "version") {
        Some(f) if matches!(f.schema, Schema::Long) => None,
        Some(f) => Some(format!("field `version` must be long, is {}", f.schema.canonical_form())),
        None => Some("has no field `version` (the business version that orders facts of one subject)".to_owned()),
    }
}

/// Why data written with one schema cannot be read with another.
enum Incompatibility {
    /// The reader has a field the writer lacks, and no default for it.
    NoDefault { field: String },
    /// The field's writer type does not resolve to its reader type.
    Type { field: String, writer: String, reader: String },
    /// Anything else, in the library's words.
    Other(String),
}

impl Incompatibility {
    fn words(&self, writer_v: u32, reader_v: u32) -> String {
        match self {
            Incompatibility::NoDefault { field } if reader_v > writer_v => {
                format!("v{reader_v} adds field `{field}` without a default")
            }
            Incompatibility::NoDefault { field } => {
                format!("v{writer_v} removes field `{field}`, which has no default in v{reader_v}")
            }
            Incompatibility::Type { field, writer, reader } => {
                format!("field `{field}` is {writer} in v{writer_v} but {reader} in v{reader_v}, and Avro cannot read {writer} as {reader}")
            }
            Incompatibility::Other(reason) => reason.clone(),
        }
    }
}

/// Every reason data written with `writer` cannot be read with `reader`.
fn incompatibilities(writer: &Schema, reader: &Schema) -> Vec<Incompatibility> {
    let Err(whole) = SchemaCompatibility::can_read(writer, reader) else {
        return Vec::new();
    };
    let (Schema::Record(w), Schema::Record(r)) = (writer, reader) else {
        return vec![Incompatibility::Other(plain(&whole))];
    };
    let mut found = Vec::new();
    for field in &r.fields {
        let single =
            Schema::Record(RecordSchema { fields: vec![field.clone()], lookup: BTreeMap::from([(field.name.clone(), 0)]), ..r.clone() });
        match SchemaCompatibility::can_read(writer, &single) {
            Ok(_) => {}
            Err(CompatibilityError::MissingDefaultValue(name)) => found.push(Incompatibility::NoDefault { field: name }),
            Err(CompatibilityError::FieldTypeMismatch(name, _)) => {
                let writer_type = w.lookup.get(&name).map(|&i| w.fields[i].schema.canonical_form()).unwrap_or_default();
                found.push(Incompatibility::Type { field: name, writer: writer_type, reader: field.schema.canonical_form() });
            }
            Err(other) => found.push(Incompatibility::Other(plain(&other))),
        }
    }
    if found.is_empty() {
        // Not a field's fault (e.g. the record was renamed).
        found.push(Incompatibility::Other(plain(&whole)));
    }
    found
}

fn plain(e: &CompatibilityError) -> String {
    use std::error::Error;
    let mut text = e.to_string();
    if let Some(source) = e.source() {
        text.push_str(": ");
        text.push_str(&source.to_string());
    }
    text
}

#[cfg(test)]
mod tests;
