//! The stats projection (invariant 8's effect side): its counters are the
//! completions its inbox says it applied, summed by day, caller and format.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::canonical;
use crate::model::{Completion, Horizons, InboxRow, Kind, STATS, StatsCounter};
use crate::report::{CheckReport, Violation};

pub const STATS_MATCH_COMPLETIONS: &str = "stats_match_completions";

/// (day, caller, format): a counter's key.
type Key = (String, String, String);

/// Each counter (exports and bytes) equals the sum over the completions the
/// stats inbox holds, each fact once: an increment applied twice, or lost,
/// while the inbox row committed, breaks the inbox's one-transaction promise.
/// `undecodable`: completion rows (seq, why) the audit could not attribute.
pub fn stats_match_completions(
    completions: &[Completion],
    undecodable: &[(i64, String)],
    inbox: &[InboxRow],
    counters: &[StatsCounter],
    horizons: &Horizons,
) -> CheckReport {
    // A day that began above both horizons has every completion row and
    // every stats inbox row of its exports; earlier days may have lost some.
    let horizon = horizons.get(Kind::Outbox).into_iter().chain(horizons.get(Kind::Inbox)).max();
    let last_pruned_day = horizon.map(day_of);
    let checked_day = |day: &str| last_pruned_day.as_deref().is_none_or(|last| day > last);
    let applied: HashSet<(&str, &str)> =
        inbox.iter().filter(|r| r.subscription == STATS).map(|r| (canonical(&r.source), r.event_id.as_str())).collect();
    let mut expected: BTreeMap<Key, (i64, i64)> = BTreeMap::new();
    let mut attributed = 0;
    for c in completions.iter().filter(|c| applied.contains(&(canonical(&c.source), c.event_id.as_str()))) {
        attributed += 1;
        let sum = expected.entry((day_of(c.completed_at_ms), c.caller.clone(), c.format.clone())).or_default();
        sum.0 += 1;
        sum.1 += c.size_bytes;
    }
    let actual: BTreeMap<Key, (i64, i64)> =
        counters.iter().map(|c| ((c.day.clone(), c.caller.clone(), c.format.clone()), (c.exports, c.bytes))).collect();
    let keys: BTreeSet<&Key> = expected.keys().chain(actual.keys()).filter(|k| checked_day(&k.0)).collect();
    let below: BTreeSet<&str> = expected.keys().chain(actual.keys()).filter(|k| !checked_day(&k.0)).map(|k| k.0.as_str()).collect();
    let mut violations: Vec<Violation> = keys.into_iter().filter_map(|k| compare(k, expected.get(k), actual.get(k))).collect();
    for (seq, why) in undecodable {
        violations.push(Violation::new(
            "undecodable_completion",
            format!("outbox seq {seq}: the completion's data does not decode ({why}); its count cannot be checked"),
        ));
    }
    let unattributed = applied.len().saturating_sub(attributed);
    let mut notes: Vec<String> = Vec::new();
    if unattributed > 0 {
        notes.push(format!("{unattributed} fact(s) in the stats inbox have no completion in the outbox (see outbox_in_kafka)"));
    }
    if let (false, Some(last)) = (below.is_empty(), &last_pruned_day) {
        notes.push(format!("{} day(s) up to {last}, the prune horizon's, not checked: their rows may be pruned", below.len()));
    }
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    CheckReport::new(
        STATS_MATCH_COMPLETIONS,
        "8: stats counters = the completions the stats inbox applied",
        counters.len() + attributed,
        violations,
    )
    .with_note(note)
}

fn compare(key: &Key, expected: Option<&(i64, i64)>, actual: Option<&(i64, i64)>) -> Option<Violation> {
    let (want, have) = (expected.copied().unwrap_or_default(), actual.copied().unwrap_or_default());
    let (day, caller, format) = key;
    if want.0 != have.0 {
        return Some(Violation::new(
            "counter_mismatch",
            format!("{day} {caller} {format}: the counter says {} export(s), the stats inbox applied {} completion(s)", have.0, want.0),
        ));
    }
    (want.1 != have.1).then(|| {
        Violation::new(
            "bytes_mismatch",
            format!("{day} {caller} {format}: the counter says {} bytes, the applied completions {}", have.1, want.1),
        )
    })
}

/// `YYYY-MM-DD` (UTC) of an epoch-millisecond time: the stats projection's day.
fn day_of(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default().format("%Y-%m-%d").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats_match_completions(
        completions: &[Completion],
        undecodable: &[(i64, String)],
        inbox: &[InboxRow],
        counters: &[StatsCounter],
    ) -> CheckReport {
        super::stats_match_completions(completions, undecodable, inbox, counters, &Horizons::default())
    }

    /// 2025-11-29 12:00 UTC.
    const NOON: i64 = 1_764_417_600_000;

    fn completion(id: &str, format: &str, at: i64, size: i64) -> Completion {
        Completion {
            source: "/herald/exports".into(),
            event_id: id.into(),
            job_id: format!("job-{id}"),
            caller: "alice".into(),
            format: format.into(),
            completed_at_ms: at,
            event_time_ms: at,
            size_bytes: size,
        }
    }

    fn stats_row(source: &str, id: &str) -> InboxRow {
        InboxRow { subscription: STATS.into(), source: source.into(), event_id: id.into(), topic: "events".into(), partition: 0, offset: 0 }
    }

    fn counter(day: &str, format: &str, exports: i64, bytes: i64) -> StatsCounter {
        StatsCounter { day: day.into(), caller: "alice".into(), format: format.into(), exports, bytes }
    }

    fn evidence() -> (Vec<Completion>, Vec<InboxRow>) {
        let completions = vec![completion("e1", "csv", NOON, 10), completion("e2", "csv", NOON + 1, 5), completion("e3", "json", 0, 7)];
        let inbox = ["e1", "e2", "e3"].iter().map(|id| stats_row("/herald/exports", id)).collect();
        (completions, inbox)
    }

    #[test]
    fn counters_are_the_applied_completions_by_day_caller_and_format() {
        let (completions, inbox) = evidence();
        let counters = [counter("2025-11-29", "csv", 2, 15), counter("1970-01-01", "json", 1, 7)];
        let report = stats_match_completions(&completions, &[], &inbox, &counters);
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!(report.checked, 5);
        // A fact claimed twice (an alias row) is one applied completion: inbox_once names the row.
        let mut aliased = inbox.clone();
        aliased.push(stats_row("urn:herald:exports", "e1"));
        assert!(stats_match_completions(&completions, &[], &aliased, &counters).violations.is_empty());
    }

    #[test]
    fn a_counter_off_by_an_increment_is_named() {
        let (completions, inbox) = evidence();
        let counters = [counter("2025-11-29", "csv", 3, 15), counter("1970-01-01", "json", 1, 8), counter("2025-11-30", "csv", 1, 1)];
        let report = stats_match_completions(&completions, &[], &inbox, &counters);
        assert_eq!(report.count("counter_mismatch"), 2, "{:?}", report.violations);
        assert_eq!(report.count("bytes_mismatch"), 1, "{:?}", report.violations);
        assert!(
            report.violations.iter().any(|v| v.detail.starts_with("2025-11-29 alice csv: the counter says 3")),
            "{:?}",
            report.violations
        );
    }

    #[test]
    fn completions_the_inbox_never_applied_are_not_expected_in_counters() {
        let (completions, mut inbox) = evidence();
        inbox.retain(|r| r.event_id != "e3");
        let counters = [counter("2025-11-29", "csv", 2, 15), counter("1970-01-01", "json", 1, 7)];
        let report = stats_match_completions(&completions, &[(9, "bad".into())], &inbox, &counters);
        assert_eq!(report.count("counter_mismatch"), 1, "{:?}", report.violations);
        assert_eq!(report.count("undecodable_completion"), 1);
        inbox.push(stats_row("/herald/exports", "elsewhere"));
        assert!(stats_match_completions(&completions, &[], &inbox, &counters).note.is_some());
    }

    #[test]
    fn days_up_to_the_prune_horizon_are_not_compared() {
        // The 1970 completion's row was pruned; its counter stays.
        let (mut completions, mut inbox) = evidence();
        completions.retain(|c| c.event_id != "e3");
        inbox.retain(|r| r.event_id != "e3");
        let counters = [counter("2025-11-29", "csv", 2, 15), counter("1970-01-01", "json", 1, 7)];
        let unpruned = stats_match_completions(&completions, &[], &inbox, &counters);
        assert_eq!(unpruned.count("counter_mismatch"), 1, "without a horizon the lost row shows");
        let mut horizons = Horizons::default();
        horizons.set(Kind::Outbox, 86_400_000 * 2);
        let report = super::stats_match_completions(&completions, &[], &inbox, &counters, &horizons);
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert!(report.note.as_deref().is_some_and(|n| n.contains("1970-01-03")), "{:?}", report.note);
        // A wrong counter above the horizon is still named.
        let wrong = [counter("2025-11-29", "csv", 3, 15)];
        assert_eq!(super::stats_match_completions(&completions, &[], &inbox, &wrong, &horizons).count("counter_mismatch"), 1);
    }
}
