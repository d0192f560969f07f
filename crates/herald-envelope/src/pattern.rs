//! Names as configuration writes them: exact (`shop.order.placed`), or a
//! prefix ending in `*` (`shop.order.*`, `/billing/*`). One reading for every
//! list of them — accepted sources, versioned schema subjects, the relay's
//! routes, notification rules — so `*` means the same everywhere.

use std::collections::BTreeMap;

/// One pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamePattern {
    Exact(String),
    Prefix(String),
}

impl NamePattern {
    /// `text`, trimmed; empty, a bare `*` or a `*` elsewhere than at the end
    /// is refused with the reason.
    pub fn parse(text: &str) -> Result<NamePattern, String> {
        let text = text.trim();
        let (stem, prefix) = match text.strip_suffix('*') {
            Some(stem) => (stem, true),
            None => (text, false),
        };
        if stem.is_empty() || stem.contains('*') {
            return Err(format!("`{text}` is neither a name nor a prefix ending in `*`"));
        }
        Ok(if prefix { NamePattern::Prefix(stem.to_owned()) } else { NamePattern::Exact(stem.to_owned()) })
    }

    pub fn matches(&self, name: &str) -> bool {
        match self {
            NamePattern::Exact(exact) => name == exact,
            NamePattern::Prefix(prefix) => name.starts_with(prefix.as_str()),
        }
    }
}

/// Values by pattern, looked up the way a reader expects: the exact pattern
/// of a name, else the longest prefix that matches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternMap<T> {
    exact: BTreeMap<String, T>,
    /// Longest first.
    prefixes: Vec<(String, T)>,
}

impl<T> Default for PatternMap<T> {
    fn default() -> Self {
        PatternMap { exact: BTreeMap::new(), prefixes: Vec::new() }
    }
}

impl<T> PatternMap<T> {
    /// Adds `value` under `pattern`; `Err(value)` when the pattern has one.
    pub fn insert(&mut self, pattern: NamePattern, value: T) -> Result<(), T> {
        match pattern {
            NamePattern::Exact(name) if !self.exact.contains_key(&name) => {
                self.exact.insert(name, value);
            }
            NamePattern::Prefix(prefix) if !self.prefixes.iter().any(|(p, _)| *p == prefix) => {
                let at = self.prefixes.iter().position(|(p, _)| p.len() < prefix.len()).unwrap_or(self.prefixes.len());
                self.prefixes.insert(at, (prefix, value));
            }
            _ => return Err(value),
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&T> {
        self.exact.get(name).or_else(|| self.prefixes.iter().find(|(p, _)| name.starts_with(p.as_str())).map(|(_, v)| v))
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.exact.values().chain(self.prefixes.iter().map(|(_, v)| v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(entries: &[(&str, u8)]) -> PatternMap<u8> {
        let mut map = PatternMap::default();
        for (pattern, value) in entries {
            map.insert(NamePattern::parse(pattern).unwrap(), *value).unwrap();
        }
        map
    }

    #[test]
    fn exact_wins_then_the_longest_prefix() {
        let map = map(&[("a.*", 1), ("a.b.*", 2), ("a.b.c", 3)]);
        assert_eq!(map.get("a.b.c"), Some(&3));
        assert_eq!(map.get("a.b.d"), Some(&2));
        assert_eq!(map.get("a.x"), Some(&1));
        assert_eq!(map.get("b"), None);
        assert_eq!(map.values().count(), 3);
    }

    #[test]
    fn a_pattern_given_twice_or_malformed_is_refused() {
        let mut m = map(&[("a.*", 1)]);
        assert_eq!(m.insert(NamePattern::parse("a.*").unwrap(), 2), Err(2));
        for bad in ["", "*", "a*b", " * "] {
            assert!(NamePattern::parse(bad).is_err(), "{bad:?}");
        }
        assert!(NamePattern::parse("/billing/*").unwrap().matches("/billing/x"));
        assert!(!NamePattern::parse("/billing").unwrap().matches("/billing/x"), "exact is not a prefix");
    }
}
