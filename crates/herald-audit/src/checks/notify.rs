//! Notifications (invariant 9): one intent per (completion, recipient), and
//! the provider's effects are the sent intents, one each.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::canonical;
use crate::model::{Completion, Horizons, InboxRow, Intent, Job, Kind, NOTIFY, SENT};
use crate::report::{CheckReport, Violation};

const UNKNOWN: &str = "unknown";

pub const INTENTS_ONCE: &str = "intents_once";
pub const NOTIFY_EFFECTS: &str = "notify_effects";
const INVARIANT: &str = "9: provider effects = sent intents, one effect per key";

/// Each completion the notify inbox applied has exactly one intent for its
/// recipient (the caller who asked for the export), counting a legacy alias
/// of the source as the same fact; every intent notifies of a known
/// completion, and to its recipient.
pub fn intents_once(completions: &[Completion], inbox: &[InboxRow], intents: &[Intent], jobs: &[Job], horizons: &Horizons) -> CheckReport {
    let completed: HashMap<&str, Option<i64>> = jobs.iter().map(|j| (j.job_id.as_str(), j.completed_at_ms)).collect();
    // The completion row of a job that completed before the outbox horizon
    // may be pruned while its intent, not yet settled, stays.
    let completion_pruned = |job_id: &str| horizons.may_be_pruned(Kind::Outbox, completed.get(job_id).copied().flatten());
    let mut below = 0;
    let applied: HashSet<(&str, &str)> =
        inbox.iter().filter(|r| r.subscription == NOTIFY).map(|r| (canonical(&r.source), r.event_id.as_str())).collect();
    let by_fact: HashMap<(&str, &str), &Completion> =
        completions.iter().map(|c| ((canonical(&c.source), c.event_id.as_str()), c)).collect();
    let mut per_recipient: HashMap<(&str, &str, &str), Vec<&str>> = HashMap::new();
    let mut violations = Vec::new();
    for intent in intents {
        let fact = (canonical(&intent.source), intent.event_id.as_str());
        per_recipient.entry((fact.0, fact.1, intent.recipient.as_str())).or_default().push(&intent.key);
        match by_fact.get(&fact) {
            None if completion_pruned(&intent.job_id) => below += 1,
            None => violations.push(Violation::new(
                "intent_without_completion",
                format!("intent {} notifies of {} {}, which is no completion in the outbox", intent.key, intent.source, intent.event_id),
            )),
            Some(c) if c.caller != intent.recipient => violations.push(Violation::new(
                "unexpected_recipient",
                format!("intent {} notifies {} of job {}, which {} asked for", intent.key, intent.recipient, c.job_id, c.caller),
            )),
            Some(_) => {}
        }
    }
    let mut checked = intents.len();
    for c in completions.iter().filter(|c| applied.contains(&(canonical(&c.source), c.event_id.as_str()))) {
        // Its intent is dated after the event: above the horizon it stays.
        if horizons.below(Kind::Intents, c.event_time_ms) {
            below += 1;
            continue;
        }
        checked += 1;
        let keys = per_recipient.get(&(canonical(&c.source), c.event_id.as_str(), c.caller.as_str())).map_or(&[][..], Vec::as_slice);
        let what = format!("completion {} {} (job {}) for {}: {} intent(s) {keys:?}", c.source, c.event_id, c.job_id, c.caller, keys.len());
        match keys.len() {
            1 => {}
            0 => violations.push(Violation::new("missing_intent", what)),
            _ => violations.push(Violation::new("duplicate_intent", what)),
        }
    }
    CheckReport::new(INTENTS_ONCE, "9: one intent per (completion, recipient)", checked, violations)
        .with_note(super::below_note(below, Kind::Intents))
}

/// `effects`: effects per idempotency key as the provider recorded them.
/// A `sent` intent has exactly one effect; an `unknown` one at most one —
/// whether the provider executed it is what nobody knew, so either count is
/// honest, but a second is a duplicate; any other status none.
pub fn notify_effects(intents: &[Intent], effects: Option<&BTreeMap<String, i64>>, horizons: &Horizons) -> CheckReport {
    let Some(effects) = effects else {
        return CheckReport::skipped(NOTIFY_EFFECTS, INVARIANT, "no provider URL given");
    };
    let mut violations = Vec::new();
    let (mut unknown, mut unknown_executed) = (0, 0);
    for intent in intents {
        let n = effects.get(&intent.key).copied().unwrap_or(0);
        let key = &intent.key;
        match (intent.status.as_str(), n) {
            (SENT, 1) | (UNKNOWN, 0 | 1) => {}
            (SENT, 0) => violations
                .push(Violation::new("missing_effect", format!("intent {key} is sent but the provider executed nothing under its key"))),
            (SENT | UNKNOWN, n) => violations
                .push(Violation::new("duplicate_effect", format!("intent {key} ({}): {n} effects at the provider", intent.status))),
            (_, 0) => {}
            (other, n) => violations
                .push(Violation::new("effect_without_sent_intent", format!("{n} effect(s) under key {key}, whose intent is {other}"))),
        }
        if intent.status == UNKNOWN {
            unknown += 1;
            unknown_executed += usize::from(n == 1);
        }
    }
    let known: HashSet<&str> = intents.iter().map(|i| i.key.as_str()).collect();
    let mut pruned = 0;
    for (key, n) in effects.iter().filter(|(key, _)| !known.contains(key.as_str())) {
        match n {
            // One effect under a key no intent holds any more: a settled
            // intent a prune removed, as far as the provider can tell.
            1 if horizons.get(Kind::Intents).is_some() && !key.is_empty() => pruned += 1,
            n if *n > 1 && horizons.get(Kind::Intents).is_some() && !key.is_empty() => {
                violations.push(Violation::new("duplicate_effect", format!("{n} effects under key {key:?}, whose intent is pruned")))
            }
            n => violations.push(Violation::new("effect_without_intent", format!("{n} effect(s) under key {key:?}, which no intent has"))),
        }
    }
    let mut notes = Vec::new();
    if unknown > 0 {
        notes.push(format!("{unknown} intent(s) unknown, {unknown_executed} of them executed at the provider: `herald notify reconcile`"));
    }
    if pruned > 0 {
        notes.push(format!("{pruned} key(s) with one effect and no intent: settled intents below the intents prune horizon"));
    }
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    CheckReport::new(NOTIFY_EFFECTS, INVARIANT, intents.len() + effects.len(), violations).with_note(note)
}

/// Effects beyond the first per key: what a duplicate notification costs.
pub fn duplicates(effects: &BTreeMap<String, i64>) -> i64 {
    effects.values().map(|n| (n - 1).max(0)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intents_once(completions: &[Completion], inbox: &[InboxRow], intents: &[Intent]) -> CheckReport {
        super::intents_once(completions, inbox, intents, &[], &Horizons::default())
    }

    fn notify_effects(intents: &[Intent], effects: Option<&BTreeMap<String, i64>>) -> CheckReport {
        super::notify_effects(intents, effects, &Horizons::default())
    }

    fn intent(key: &str, status: &str) -> Intent {
        Intent {
            key: key.into(),
            status: status.into(),
            source: "/herald/exports".into(),
            event_id: key.into(),
            recipient: "alice".into(),
            job_id: format!("job-{key}"),
        }
    }

    fn completion(id: &str) -> Completion {
        Completion {
            source: "/herald/exports".into(),
            event_id: id.into(),
            job_id: format!("job-{id}"),
            caller: "alice".into(),
            format: "csv".into(),
            completed_at_ms: 0,
            size_bytes: 1,
            event_time_ms: 0,
        }
    }

    fn notified(id: &str) -> InboxRow {
        InboxRow {
            subscription: NOTIFY.into(),
            source: "/herald/exports".into(),
            event_id: id.into(),
            topic: "events".into(),
            partition: 0,
            offset: 0,
        }
    }

    #[test]
    fn each_applied_completion_has_one_intent_for_its_recipient() {
        let completions = [completion("e1"), completion("e2"), completion("e3")];
        // e3 is not applied by notify yet: no intent is owed (inbox_once names it).
        let inbox = [notified("e1"), notified("e2")];
        let intents = vec![intent("e1", SENT), intent("e2", "pending")];
        let clean = intents_once(&completions, &inbox, &intents);
        assert!(clean.violations.is_empty(), "{:?}", clean.violations);
        assert_eq!(clean.checked, 4);

        let mut broken = intents.clone();
        broken.remove(1);
        // The same fact under a legacy alias of its source, with another key.
        broken.push(Intent { key: "other".into(), source: "urn:herald:exports".into(), ..intent("e1", "pending") });
        let report = intents_once(&completions, &inbox, &broken);
        assert_eq!(report.count("missing_intent"), 1, "{:?}", report.violations);
        assert_eq!(report.count("duplicate_intent"), 1, "{:?}", report.violations);
        assert!(report.violations.iter().any(|v| v.detail.contains("e1 (job job-e1) for alice: 2 intent(s)")), "{:?}", report.violations);
    }

    #[test]
    fn intents_of_unknown_completions_or_recipients_are_named() {
        let completions = [completion("e1")];
        let stray = [intent("zz", "pending"), Intent { recipient: "bob".into(), key: "k-bob".into(), ..intent("e1", "pending") }];
        let report = intents_once(&completions, &[], &stray);
        assert_eq!(report.count("intent_without_completion"), 1, "{:?}", report.violations);
        assert_eq!(report.count("unexpected_recipient"), 1, "{:?}", report.violations);
    }

    #[test]
    fn effects_equal_sent_intents() {
        let intents = [intent("k1", SENT), intent("k2", SENT), intent("k3", "failed"), intent("k4", "unknown")];
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

    #[test]
    fn an_unknown_intent_may_have_one_effect_but_not_two() {
        let intents = [intent("k1", "unknown"), intent("k2", "unknown")];
        let mut effects: BTreeMap<String, i64> = [("k1".to_owned(), 1)].into();
        let report = notify_effects(&intents, Some(&effects));
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert!(report.note.as_deref().is_some_and(|n| n.contains("2 intent(s) unknown, 1 of them executed")), "{:?}", report.note);
        effects.insert("k2".into(), 2);
        let report = notify_effects(&intents, Some(&effects));
        assert_eq!(report.count("duplicate_effect"), 1, "{:?}", report.violations);
        assert_eq!(duplicates(&effects), 1);
        assert!(!notify_effects(&intents, None).ran);
    }

    #[test]
    fn below_the_horizons_pruned_intents_are_not_missing_but_duplicates_still_count() {
        let mut horizons = Horizons::default();
        horizons.set(Kind::Intents, 10);
        let effects: BTreeMap<String, i64> = [("gone".to_owned(), 1), ("twice".to_owned(), 2)].into();
        let report = super::notify_effects(&[], Some(&effects), &horizons);
        assert_eq!(report.count("effect_without_intent"), 0, "{:?}", report.violations);
        assert_eq!(report.count("duplicate_effect"), 1, "{:?}", report.violations);
        assert_eq!(notify_effects(&[], Some(&effects)).count("effect_without_intent"), 2, "without a horizon both are named");

        // An intent whose completion row was pruned: its job completed below the outbox horizon.
        horizons.set(Kind::Outbox, 10);
        let job = |at: i64| Job {
            job_id: "job-k".into(),
            caller: "alice".into(),
            status: "succeeded".into(),
            result_id: None,
            format: "csv".into(),
            query: "q".into(),
            created_at_ms: 0,
            completed_at_ms: Some(at),
        };
        let orphan = [intent("k", SENT)];
        assert_eq!(super::intents_once(&[], &[], &orphan, &[job(5)], &horizons).count("intent_without_completion"), 0);
        assert_eq!(super::intents_once(&[], &[], &orphan, &[job(15)], &horizons).count("intent_without_completion"), 1);
    }
}
