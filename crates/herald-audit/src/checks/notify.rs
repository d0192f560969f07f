//! Notifications (invariant 9): the provider's effects are the sent intents,
//! one each.

use std::collections::{BTreeMap, HashMap};

use crate::model::{Intent, SENT};
use crate::report::{CheckReport, Violation};

pub const NOTIFY_EFFECTS: &str = "notify_effects";
const INVARIANT: &str = "9: provider effects = sent intents, one effect per key";

/// `effects`: effects per idempotency key as the provider recorded them.
pub fn notify_effects(intents: &[Intent], effects: Option<&BTreeMap<String, i64>>) -> CheckReport {
    let Some(effects) = effects else {
        return CheckReport::skipped(NOTIFY_EFFECTS, INVARIANT, "no provider URL given");
    };
    let status: HashMap<&str, &str> = intents.iter().map(|i| (i.key.as_str(), i.status.as_str())).collect();
    let mut violations = Vec::new();
    for intent in intents.iter().filter(|i| i.status == SENT) {
        match effects.get(&intent.key).copied().unwrap_or(0) {
            1 => {}
            0 => violations.push(Violation::new("missing_effect", format!("intent {} is sent but the provider executed nothing under its key", intent.key))),
            n => violations.push(Violation::new("duplicate_effect", format!("intent {}: {n} effects at the provider", intent.key))),
        }
    }
    for (key, n) in effects {
        match status.get(key.as_str()) {
            Some(&SENT) => {}
            Some(other) => violations.push(Violation::new("effect_without_sent_intent", format!("{n} effect(s) under key {key}, whose intent is {other}"))),
            None => violations.push(Violation::new("effect_without_intent", format!("{n} effect(s) under key {key:?}, which no intent has"))),
        }
    }
    let unknown = intents.iter().filter(|i| i.status == "unknown").count();
    let note = (unknown > 0).then(|| format!("{unknown} intent(s) unknown: `herald notify reconcile`"));
    CheckReport::new(NOTIFY_EFFECTS, INVARIANT, intents.len() + effects.len(), violations).with_note(note)
}

/// Effects beyond the first per key: what a duplicate notification costs.
pub fn duplicates(effects: &BTreeMap<String, i64>) -> i64 {
    effects.values().map(|n| (n - 1).max(0)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(key: &str, status: &str) -> Intent {
        Intent { key: key.into(), status: status.into() }
    }

    #[test]
    fn effects_equal_sent_intents() {
        let intents = [intent("k1", SENT), intent("k2", SENT), intent("k3", "unknown")];
        let mut effects: BTreeMap<String, i64> = [("k1".to_owned(), 1), ("k2".to_owned(), 1)].into();
        assert!(notify_effects(&intents, Some(&effects)).violations.is_empty());
        effects.insert("k1".into(), 2);
        effects.insert("k3".into(), 1);
        effects.insert("zz".into(), 1);
        effects.remove("k2");
        let report = notify_effects(&intents, Some(&effects));
        for kind in ["duplicate_effect", "missing_effect", "effect_without_sent_intent", "effect_without_intent"] {
            assert_eq!(report.count(kind), 1, "{kind}: {:?}", report.violations);
        }
        assert_eq!(duplicates(&effects), 1);
        assert!(!notify_effects(&intents, None).ran);
    }
}
