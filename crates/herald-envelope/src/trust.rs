//! Which CloudEvents sources a consumer takes records from.
//!
//! A topic is writable by anyone with produce rights on it, and `(source,
//! id)` is the identity the inbox deduplicates by: a record from a service
//! nobody vouched for could otherwise write projections, count as a
//! completion or trigger a notification. So every record is checked against
//! an allow-list before any handler sees it, the legacy envelope too (its
//! `event_source` after normalisation), and a stranger's record is refused
//! as `untrusted source` (the consumer dead-letters it).

use std::sync::Arc;

use crate::pattern::NamePattern;
use crate::{EnvelopeError, SOURCE_EXPORTS};

/// Sources accepted: exact values, or prefixes written with a final `*`
/// (`/billing/*`). Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sources(Arc<(Vec<String>, Vec<NamePattern>)>);

impl Sources {
    /// Herald's own: the export service's `/herald/exports`.
    pub fn herald() -> Sources {
        Sources::new([SOURCE_EXPORTS.to_owned()]).expect("Herald's own source is a valid pattern")
    }

    /// `patterns` (each an exact source or a prefix ending in `*`); an empty
    /// list, an empty pattern or a `*` elsewhere than at the end is refused.
    pub fn new(patterns: impl IntoIterator<Item = String>) -> Result<Sources, EnvelopeError> {
        let patterns: Vec<String> = patterns.into_iter().map(|p| p.trim().to_owned()).collect();
        let bad = |reason: String| EnvelopeError::InvalidAttribute { name: "source", reason };
        if patterns.is_empty() {
            return Err(bad("no source accepted: name at least one".into()));
        }
        let parsed = patterns
            .iter()
            .map(|p| NamePattern::parse(p).map_err(|_| bad(format!("`{p}` is neither a source nor a prefix ending in `*`"))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Sources(Arc::new((patterns, parsed))))
    }

    pub fn accepts(&self, source: &str) -> bool {
        self.0.1.iter().any(|pattern| pattern.matches(source))
    }

    /// `Err(UntrustedSource)` unless `source` is accepted.
    pub fn check(&self, source: &str) -> Result<(), EnvelopeError> {
        if self.accepts(source) { Ok(()) } else { Err(EnvelopeError::UntrustedSource(source.to_owned())) }
    }

    pub fn patterns(&self) -> &[String] {
        &self.0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_and_prefix_patterns() {
        let sources = Sources::new(["/herald/exports".to_owned(), "/billing/*".to_owned()]).unwrap();
        assert!(sources.accepts("/herald/exports"));
        assert!(sources.accepts("/billing/invoices"));
        assert!(!sources.accepts("/herald/exports/x"), "an exact pattern is not a prefix");
        assert!(!sources.accepts("/billing"), "the prefix includes its slash");
        assert!(!sources.accepts("/mallory"));
        assert!(matches!(sources.check("/mallory"), Err(EnvelopeError::UntrustedSource(s)) if s == "/mallory"));
    }

    #[test]
    fn herald_accepts_only_its_own() {
        assert!(Sources::herald().accepts(SOURCE_EXPORTS));
        assert!(!Sources::herald().accepts("/anything/else"));
    }

    #[test]
    fn bad_patterns_are_refused() {
        for patterns in [vec![], vec![String::new()], vec!["*".to_owned()], vec!["/a*/b".to_owned()]] {
            assert!(Sources::new(patterns.clone()).is_err(), "{patterns:?}");
        }
    }
}
