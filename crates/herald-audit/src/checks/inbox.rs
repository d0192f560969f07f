//! Inboxes (invariant 8): each completion event has exactly one inbox row in
//! each subscription that applies it.

use std::collections::HashMap;

use super::canonical;
use crate::model::{COMPLETED, COMPLETION_SUBSCRIPTIONS, Horizons, InboxRow, Kind, OutboxRow};
use crate::report::{CheckReport, Violation};

pub const INBOX_ONCE: &str = "inbox_once";

pub fn inbox_once(outbox: &[OutboxRow], inbox: &[InboxRow], horizons: &Horizons) -> CheckReport {
    let mut rows: HashMap<(&str, &str, &str), usize> = HashMap::new();
    for r in inbox {
        *rows.entry((r.subscription.as_str(), canonical(&r.source), r.event_id.as_str())).or_default() += 1;
    }
    let all: Vec<&OutboxRow> = outbox.iter().filter(|o| o.delivered() && o.event_type == COMPLETED).collect();
    // Every inbox row of an event is dated after the event: above the
    // horizon, none can have been pruned.
    let (completions, below): (Vec<&OutboxRow>, Vec<&OutboxRow>) =
        all.into_iter().partition(|o| !horizons.below(Kind::Inbox, o.event_time_ms));
    let mut violations = Vec::new();
    for event in &completions {
        for subscription in COMPLETION_SUBSCRIPTIONS {
            let n = rows.get(&(subscription, canonical(&event.source), event.event_id.as_str())).copied().unwrap_or(0);
            let what =
                format!("{subscription}: {} inbox rows for completion {} {} (job {})", n, event.source, event.event_id, event.subject);
            match n {
                1 => {}
                0 => violations.push(Violation::new("missing_inbox_row", what)),
                _ => violations.push(Violation::new("duplicate_inbox_row", what)),
            }
        }
    }
    let note = super::below_note(below.len(), Kind::Inbox);
    CheckReport::new(
        INBOX_ONCE,
        "8: one inbox row per completion event and subscription",
        completions.len() * COMPLETION_SUBSCRIPTIONS.len(),
        violations,
    )
    .with_note(note)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inbox_once(outbox: &[OutboxRow], inbox: &[InboxRow]) -> CheckReport {
        super::inbox_once(outbox, inbox, &Horizons::default())
    }

    fn completion(id: &str) -> OutboxRow {
        OutboxRow {
            seq: 1,
            commit_rank: 1,
            source: "/herald/exports".into(),
            event_id: id.into(),
            event_type: COMPLETED.into(),
            subject: "job".into(),
            topic: "events".into(),
            partition_key: "job".into(),
            status: "delivered".into(),
            event_time_ms: 0,
        }
    }

    fn inbox(subscription: &str, source: &str, id: &str) -> InboxRow {
        InboxRow {
            subscription: subscription.into(),
            source: source.into(),
            event_id: id.into(),
            topic: "events".into(),
            partition: 0,
            offset: 0,
        }
    }

    #[test]
    fn one_row_per_subscription_counting_legacy_aliases_as_the_same_fact() {
        let outbox = [completion("e1")];
        let mut rows: Vec<InboxRow> = COMPLETION_SUBSCRIPTIONS.iter().map(|s| inbox(s, "/herald/exports", "e1")).collect();
        // A rebuild's replay scope is not a subscription.
        rows.push(inbox("search@g2", "/herald/exports", "e1"));
        assert!(inbox_once(&outbox, &rows).violations.is_empty());

        rows.push(inbox("stats", "urn:herald:exports", "e1"));
        let report = inbox_once(&outbox, &rows);
        assert_eq!(report.count("duplicate_inbox_row"), 1);
        assert!(report.violations[0].detail.starts_with("stats: 2 inbox rows"), "{:?}", report.violations);

        rows.retain(|r| r.subscription != "notify");
        assert_eq!(inbox_once(&outbox, &rows).count("missing_inbox_row"), 1);
    }

    #[test]
    fn completions_below_the_inbox_horizon_are_not_counted() {
        let mut old = completion("e1");
        old.event_time_ms = 5;
        let mut new = completion("e2");
        new.event_time_ms = 10;
        let mut horizons = Horizons::default();
        horizons.set(Kind::Inbox, 10);
        // No inbox rows at all: e1's may be pruned, e2's may not.
        let report = super::inbox_once(&[old, new], &[], &horizons);
        assert_eq!(report.count("missing_inbox_row"), COMPLETION_SUBSCRIPTIONS.len(), "{:?}", report.violations);
        assert!(report.violations.iter().all(|v| v.detail.contains("e2")), "{:?}", report.violations);
    }
}
