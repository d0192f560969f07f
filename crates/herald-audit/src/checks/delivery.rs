//! Outbox ↔ Kafka: identity (invariants 5, 7) and per-key order (invariant 6).

use std::collections::{BTreeMap, HashMap, HashSet};

use super::identity;
use crate::model::{Horizons, KafkaHistory, Kind, OutboxRow};
use crate::report::{CheckReport, Violation};

pub const OUTBOX_IN_KAFKA: &str = "outbox_in_kafka";
pub const KEY_ORDER: &str = "key_order";

/// Each delivered outbox row is in Kafka, on its topic, under its key, with
/// the same (`source`, `id`); each record in Kafka has its outbox row (a
/// record without one is a fact the database no longer holds).
pub fn outbox_in_kafka(outbox: &[OutboxRow], kafka: &KafkaHistory, horizons: &Horizons) -> CheckReport {
    let mut in_kafka: HashMap<(String, String, String), Vec<&str>> = HashMap::new();
    let mut violations = Vec::new();
    for r in &kafka.records {
        if r.event_id.is_empty() || r.source.is_empty() {
            violations.push(Violation::new("no_identity", format!("{}/{}@{} carries no ce_source/ce_id", r.topic, r.partition, r.offset)));
            continue;
        }
        in_kafka.entry((r.topic.clone(), r.source.clone(), r.event_id.clone())).or_default().push(&r.key);
    }
    let rows: HashSet<(String, String, String)> = outbox.iter().map(|o| (o.topic.clone(), o.source.clone(), o.event_id.clone())).collect();
    for row in outbox.iter().filter(|o| o.delivered()) {
        let at = (row.topic.clone(), row.source.clone(), row.event_id.clone());
        match in_kafka.get(&at) {
            None => violations.push(Violation::new(
                "missing_in_kafka",
                format!(
                    "outbox seq {} ({} {} {}, key {}) is delivered but not on {}",
                    row.seq, row.event_type, row.source, row.event_id, row.partition_key, row.topic
                ),
            )),
            Some(keys) if keys.iter().any(|k| *k != row.partition_key) => violations.push(Violation::new(
                "wrong_key",
                format!("{} {} is in Kafka under key(s) {keys:?}, its outbox row says {}", row.source, row.event_id, row.partition_key),
            )),
            Some(_) => {}
        }
    }
    let mut below = 0;
    for r in kafka.records.iter().filter(|r| !r.event_id.is_empty() && !r.source.is_empty()) {
        if !rows.contains(&(r.topic.clone(), r.source.clone(), r.event_id.clone())) {
            // Produced before the horizon: its row was delivered later
            // still, and may have been pruned since.
            if r.timestamp_ms.is_some_and(|t| horizons.below(Kind::Outbox, t)) {
                below += 1;
                continue;
            }
            violations.push(Violation::new(
                "no_outbox_row",
                format!("{}/{}@{} ({} {}, key {}) has no outbox row", r.topic, r.partition, r.offset, r.source, r.event_id, r.key),
            ));
        }
    }
    let note = match (truncation_note(kafka), super::below_note(below, Kind::Outbox)) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b),
    };
    let checked = outbox.iter().filter(|o| o.delivered()).count() + kafka.records.len();
    CheckReport::new(
        OUTBOX_IN_KAFKA,
        "5, 7: each delivered outbox row is in Kafka with the same (source, id), and back",
        checked,
        violations,
    )
    .with_note(note)
}

/// The first copy of each record of a key appears in Kafka in the commit
/// order of its outbox rows. Later copies (a republish after a crash between
/// ack and progress write) carry the same id and are absorbed by inboxes,
/// which is why only first occurrences are compared.
pub fn key_order(outbox: &[OutboxRow], kafka: &KafkaHistory) -> CheckReport {
    let mut committed: BTreeMap<(&str, &str), Vec<&OutboxRow>> = BTreeMap::new();
    for row in outbox.iter().filter(|o| o.delivered()) {
        committed.entry((row.topic.as_str(), row.partition_key.as_str())).or_default().push(row);
    }
    let mut seen = HashSet::new();
    let mut published: HashMap<(&str, &str), Vec<(String, String)>> = HashMap::new();
    let mut records: Vec<_> = kafka.records.iter().collect();
    records.sort_by(|a, b| (&a.topic, a.partition, a.offset).cmp(&(&b.topic, b.partition, b.offset)));
    for r in records {
        if seen.insert((&r.topic, &r.source, &r.event_id)) {
            published.entry((r.topic.as_str(), r.key.as_str())).or_default().push(identity(&r.source, &r.event_id));
        }
    }
    let mut violations = Vec::new();
    for ((topic, key), mut rows) in committed {
        rows.sort_by_key(|r| r.commit_rank);
        let actual = published.remove(&(topic, key)).unwrap_or_default();
        let present: HashSet<&(String, String)> = actual.iter().collect();
        let expected: Vec<(String, String)> =
            rows.iter().map(|r| identity(&r.source, &r.event_id)).filter(|id| present.contains(id)).collect();
        let wanted: HashSet<&(String, String)> = expected.iter().collect();
        let actual: Vec<&(String, String)> = actual.iter().filter(|id| wanted.contains(id)).collect();
        if let Some(i) = expected.iter().zip(&actual).position(|(e, a)| e != *a) {
            violations.push(Violation::new(
                "out_of_order",
                format!("key {key} on {topic}: position {i} holds {} in Kafka, {} in commit order", actual[i].1, expected[i].1),
            ));
        }
    }
    let checked = outbox.iter().filter(|o| o.delivered()).map(|o| (&o.topic, &o.partition_key)).collect::<HashSet<_>>().len();
    CheckReport::new(KEY_ORDER, "6: per key, first copies in Kafka follow commit order", checked, violations)
}

fn truncation_note(kafka: &KafkaHistory) -> Option<String> {
    if kafka.truncated.is_empty() {
        return None;
    }
    let parts: Vec<String> = kafka.truncated.iter().map(|((t, p), from)| format!("{t}/{p} from offset {from}")).collect();
    Some(format!("retention removed the start of {}: rows published before it show as missing", parts.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::KafkaRecord;

    fn outbox_in_kafka(outbox: &[OutboxRow], kafka: &KafkaHistory) -> CheckReport {
        super::outbox_in_kafka(outbox, kafka, &Horizons::default())
    }

    fn row(seq: i64, id: &str, key: &str, status: &str) -> OutboxRow {
        OutboxRow {
            seq,
            commit_rank: seq as usize,
            source: "/s".into(),
            event_id: id.into(),
            event_type: "t".into(),
            subject: key.into(),
            topic: "events".into(),
            partition_key: key.into(),
            status: status.into(),
            event_time_ms: 0,
        }
    }

    fn rec(offset: i64, id: &str, key: &str) -> KafkaRecord {
        KafkaRecord {
            topic: "events".into(),
            partition: 0,
            offset,
            key: key.into(),
            source: "/s".into(),
            event_id: id.into(),
            timestamp_ms: Some(offset),
        }
    }

    fn history(records: Vec<KafkaRecord>) -> KafkaHistory {
        KafkaHistory { records, truncated: Default::default() }
    }

    #[test]
    fn delivered_rows_and_records_match_both_ways() {
        let outbox = [row(1, "a", "k", "delivered"), row(2, "b", "k", "delivered"), row(3, "c", "k", "pending")];
        let clean = outbox_in_kafka(&outbox, &history(vec![rec(0, "a", "k"), rec(1, "b", "k"), rec(2, "a", "k")]));
        assert!(clean.violations.is_empty(), "{:?}", clean.violations);

        let lost = outbox_in_kafka(&outbox, &history(vec![rec(0, "a", "k")]));
        assert_eq!(lost.count("missing_in_kafka"), 1);
        assert!(lost.violations[0].detail.contains("seq 2"));

        let orphan = outbox_in_kafka(&outbox[..1], &history(vec![rec(0, "a", "k"), rec(1, "b", "k")]));
        assert_eq!(orphan.count("no_outbox_row"), 1);
        assert!(orphan.violations[0].detail.contains(" b,"), "{:?}", orphan.violations);

        let moved = outbox_in_kafka(&outbox[..1], &history(vec![rec(0, "a", "other")]));
        assert_eq!(moved.count("wrong_key"), 1);
    }

    #[test]
    fn order_compares_first_copies_with_commit_order() {
        let mut outbox = vec![row(1, "a", "k", "delivered"), row(2, "b", "k", "delivered"), row(3, "c", "k", "delivered")];
        // A republished batch: duplicates after the originals keep order.
        let replayed = history(vec![rec(0, "a", "k"), rec(1, "b", "k"), rec(2, "a", "k"), rec(3, "b", "k"), rec(4, "c", "k")]);
        assert!(key_order(&outbox, &replayed).violations.is_empty());

        let swapped = history(vec![rec(0, "a", "k"), rec(1, "c", "k"), rec(2, "b", "k")]);
        let report = key_order(&outbox, &swapped);
        assert_eq!(report.count("out_of_order"), 1);
        assert!(report.violations[0].detail.contains("position 1"), "{:?}", report.violations);

        // Commit order is the rank, not the sequence: a redriven row.
        outbox[1].commit_rank = 9;
        assert!(key_order(&outbox, &swapped).violations.is_empty());
    }

    #[test]
    fn a_record_produced_below_the_outbox_horizon_may_have_lost_its_row() {
        // Records a (timestamp 0) and b (timestamp 1); neither has a row any more.
        let kafka = history(vec![rec(0, "a", "k"), rec(1, "b", "k")]);
        let mut horizons = Horizons::default();
        horizons.set(Kind::Outbox, 1);
        let report = super::outbox_in_kafka(&[], &kafka, &horizons);
        assert_eq!(report.count("no_outbox_row"), 1, "b was produced at the horizon: its row must be there");
        assert!(report.violations[0].detail.contains(" b,"), "{:?}", report.violations);
        assert!(report.note.as_deref().is_some_and(|n| n.contains("1 fact(s) below the outbox prune horizon")), "{:?}", report.note);
    }
}
