//! What an audit found: one entry per check, each naming the invariant it
//! covers and every violation, with enough detail to find the row or record.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::model::{Horizons, Kind};

/// One broken promise, with the thing that breaks it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Short stable kind, e.g. `missing_in_kafka`, `duplicate_inbox_row`.
    pub kind: &'static str,
    /// What was found, naming ids, keys, offsets.
    pub detail: String,
}

impl Violation {
    pub fn new(kind: &'static str, detail: impl Into<String>) -> Violation {
        Violation { kind, detail: detail.into() }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    /// Stable name, e.g. `outbox_in_kafka`.
    pub check: &'static str,
    /// The promise, in words, and its number in ARCHITECTURE.md's table.
    pub invariant: &'static str,
    /// Items looked at (rows, records, jobs, keys).
    pub checked: usize,
    /// False when a source it needs was not given; it then proves nothing.
    pub ran: bool,
    pub note: Option<String>,
    pub violations: Vec<Violation>,
}

impl CheckReport {
    pub fn new(check: &'static str, invariant: &'static str, checked: usize, violations: Vec<Violation>) -> CheckReport {
        CheckReport { check, invariant, checked, ran: true, note: None, violations }
    }

    pub fn skipped(check: &'static str, invariant: &'static str, why: &str) -> CheckReport {
        CheckReport { check, invariant, checked: 0, ran: false, note: Some(why.to_owned()), violations: Vec::new() }
    }

    pub fn with_note(mut self, note: Option<String>) -> CheckReport {
        self.note = note;
        self
    }

    pub fn count(&self, kind: &str) -> usize {
        self.violations.iter().filter(|v| v.kind == kind).count()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub ok: bool,
    pub violations: usize,
    pub checks: Vec<CheckReport>,
    /// Per kind of pruned row, the time (RFC 3339) below which facts were
    /// not checked: a prune may have removed their rows.
    pub horizons: BTreeMap<&'static str, String>,
}

impl Report {
    pub fn new(checks: Vec<CheckReport>) -> Report {
        let violations = checks.iter().map(|c| c.violations.len()).sum();
        Report { ok: violations == 0, violations, checks, horizons: BTreeMap::new() }
    }

    pub fn with_horizons(mut self, horizons: &Horizons) -> Report {
        for kind in Kind::ALL {
            if let Some(at) = horizons.get(kind) {
                let time = chrono::DateTime::from_timestamp_millis(at).map_or_else(|| at.to_string(), |t| t.to_rfc3339());
                self.horizons.insert(kind.as_str(), time);
            }
        }
        self
    }

    pub fn check(&self, name: &str) -> Option<&CheckReport> {
        self.checks.iter().find(|c| c.check == name)
    }

    /// Violations of `kind` across all checks.
    pub fn count(&self, kind: &str) -> usize {
        self.checks.iter().map(|c| c.count(kind)).sum()
    }

    /// The table `herald audit` prints; at most `per_check` violations are
    /// listed per check (all are counted).
    pub fn table(&self, per_check: usize) -> String {
        let mut out = String::new();
        if !self.horizons.is_empty() {
            let below: Vec<String> = self.horizons.iter().map(|(kind, at)| format!("{kind} before {at}")).collect();
            let _ = writeln!(out, "  prune horizon: checked above it only ({})", below.join(", "));
        }
        for c in &self.checks {
            let mark = match (c.ran, c.violations.is_empty()) {
                (false, _) => "skip",
                (true, true) => " ok ",
                (true, false) => "FAIL",
            };
            let _ = writeln!(
                out,
                "  [{mark}] {:<24} {:>7} checked {:>5} violation(s)  {}",
                c.check,
                c.checked,
                c.violations.len(),
                c.invariant
            );
            if let Some(note) = &c.note {
                let _ = writeln!(out, "         note: {note}");
            }
            for v in c.violations.iter().take(per_check) {
                let _ = writeln!(out, "         {}: {}", v.kind, v.detail);
            }
            if c.violations.len() > per_check {
                let _ = writeln!(out, "         … and {} more", c.violations.len() - per_check);
            }
        }
        let _ = writeln!(out, "\n{} violation(s) in {} checks", self.violations, self.checks.len());
        out
    }
}
