//! `herald status` for people: one section per part of the pipeline, with
//! what needs a person called out (`!!`).

use std::fmt::Write;

use crate::durability::TopicDurability;
use crate::figures::Status;

/// Milliseconds as a short duration: `850ms`, `12.3s`, `4m05s`, `2h10m`.
pub fn duration(ms: i64) -> String {
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1000)
    } else {
        format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000)
    }
}

fn opt_duration(ms: Option<i64>) -> String {
    ms.map_or_else(|| "-".into(), duration)
}

/// Each subscription's parked keys, oldest first: what waits on which letter.
fn parked_keys(out: &mut String, s: &Status) {
    for sub in s.subscriptions.iter().filter(|sub| sub.parked_keys > 0) {
        let _ = writeln!(
            out,
            "  !! {}: {} key(s) parked ({} records) behind dead letters: herald dlq redrive|discard <id>",
            sub.name, sub.parked_keys, sub.parked_records
        );
        for k in &sub.oldest_parked {
            let letter = k.blocked_by.map_or_else(|| "no dead letter".to_owned(), |id| format!("dead letter {id}"));
            let _ = writeln!(
                out,
                "     key {} ({}/{} from @{}): {} record(s), parked {}, behind {letter}",
                k.key,
                k.topic,
                k.partition,
                k.first_offset,
                k.records,
                duration(k.age_ms)
            );
        }
        if sub.parked_keys > sub.oldest_parked.len() as i64 {
            let _ = writeln!(out, "     … and {} more key(s)", sub.parked_keys - sub.oldest_parked.len() as i64);
        }
    }
}

/// The whole status as a table. Every `writeln!` goes to a `String`, which
/// cannot fail, so the results are ignored.
pub fn render(s: &Status) -> String {
    let mut out = String::new();
    let o = &s.outbox;
    let _ = writeln!(out, "herald status ({})", s.backend);
    let _ = writeln!(out, "\nOUTBOX");
    let _ = writeln!(out, "  backlog {:>8}   oldest pending {}", o.backlog, opt_duration(o.oldest_pending_age_ms));
    let _ = writeln!(
        out,
        "  pending {:>8}   retryable_failed {}   failed {}   dead_lettered {}",
        o.pending, o.retryable_failed, o.failed, o.dead_lettered
    );
    if o.failed + o.dead_lettered > 0 {
        let _ = writeln!(out, "  !! {} rows set aside: herald outbox list --status failed|dead_lettered", o.failed + o.dead_lettered);
    }
    let r = &s.relay;
    let _ = writeln!(out, "\nRELAY CLAIMS");
    let _ = writeln!(out, "  live relays {}   active claims {} of {} slices", r.live_relays, r.active_claims, r.slices);
    for (owner, n) in &r.by_owner {
        let _ = writeln!(out, "  {owner:<40} {n:>3} slices");
    }
    let _ = writeln!(out, "\nSUBSCRIPTIONS");
    let _ = writeln!(
        out,
        "  {:<10} {:<28} {:>8} {:>10} {:>12} {:>9} {:>7}",
        "name", "group", "lag", "inbox", "dead letters", "redriven", "parked"
    );
    for sub in &s.subscriptions {
        let lag = sub.lag.map_or_else(|| "?".into(), |l| l.to_string());
        let group = sub.group.as_deref().unwrap_or("-");
        let flag = if sub.dead_letters > 0 { "  !!" } else { "" };
        let _ = writeln!(
            out,
            "  {:<10} {:<28} {:>8} {:>10} {:>12} {:>9} {:>7}{flag}",
            sub.name,
            group,
            lag,
            approx(sub.inbox_rows, &sub.estimated, "inbox_rows"),
            approx(sub.dead_letters, &sub.estimated, "dead_letters"),
            approx(sub.redriven, &sub.estimated, "redriven"),
            sub.parked_records
        );
    }
    parked_keys(&mut out, s);
    if let Some(e) = &s.kafka_error {
        let _ = writeln!(out, "  lag unknown: {e}");
    }
    topics(&mut out, s);
    let _ = writeln!(out, "\nNOTIFICATION INTENTS");
    if s.notifications.by_status.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for (status, n) in &s.notifications.by_status {
        let flag = if status == "unknown" && *n > 0 { "  !! outcome unknown: herald notify reconcile" } else { "" };
        let _ = writeln!(out, "  {status:<10} {:>8}{flag}", approx(*n, &s.notifications.estimated, status));
    }
    let j = &s.jobs;
    let _ = writeln!(out, "\nEXPORT JOBS");
    for (status, n) in &j.by_status {
        let _ = writeln!(out, "  {status:<10} {:>8}", approx(*n, &j.estimated, status));
    }
    let _ = writeln!(out, "  open {}   oldest open {}", j.open, opt_duration(j.oldest_open_age_ms));
    let l = &j.latency;
    let _ = writeln!(
        out,
        "  intake to terminal (last {}): p50 {}   p90 {}   p99 {}",
        l.samples,
        opt_duration(l.p50_ms),
        opt_duration(l.p90_ms),
        opt_duration(l.p99_ms)
    );
    let _ = writeln!(out, "\nPROJECTION GENERATIONS");
    for g in &s.generations {
        let active = if g.active { "  <- reads" } else { "" };
        let documents = approx(g.documents, &g.estimated, "documents");
        let _ = writeln!(out, "  {:<8} g{:<4} {:<12} {documents:>8} documents{active}", g.projection, g.generation, g.state);
    }
    let estimates = s.subscriptions.iter().any(|sub| !sub.estimated.is_empty())
        || !s.notifications.estimated.is_empty()
        || !j.estimated.is_empty()
        || s.generations.iter().any(|g| !g.estimated.is_empty());
    if estimates {
        let _ =
            writeln!(out, "\n  ~n is the database's estimate: counts above {} rows are not taken exactly", crate::counting::EXACT_UP_TO);
    }
    out
}

/// A count as printed: `~n` when it is an estimate.
fn approx(n: i64, estimated: &[String], name: &str) -> String {
    if estimated.iter().any(|e| e == name) { format!("~{n}") } else { n.to_string() }
}

fn known<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "?".into(), |v| v.to_string())
}

/// Kafka's retention: `-1` keeps for ever; whole days read as days.
fn retention(ms: Option<i64>, bytes: Option<i64>) -> String {
    let time = match ms {
        None => "?".to_owned(),
        Some(ms) if ms < 0 => "forever".to_owned(),
        Some(ms) if ms > 0 && ms % 86_400_000 == 0 => format!("{}d", ms / 86_400_000),
        Some(ms) => duration(ms),
    };
    bytes.map_or(time.clone(), |b| format!("{time}, {b}B"))
}

/// Each of Herald's topics: replication, settings, and what can lose
/// acknowledged events (`!!`), then current degradations.
fn topics(out: &mut String, s: &Status) {
    let _ = writeln!(out, "\nTOPICS");
    let Some(kafka) = &s.kafka else {
        let _ = writeln!(out, "  durability unknown: the broker was not asked or did not answer");
        return;
    };
    let _ = writeln!(
        out,
        "  {:<36} {:>5} {:>8} {:>10} {:<16} {:>7} {:>16} {:>10}",
        "topic", "parts", "replicas", "min.insync", "retention", "unclean", "under-replicated", "leaderless"
    );
    for t in &kafka.topics {
        let _ = writeln!(
            out,
            "  {:<36} {:>5} {:>8} {:>10} {:<16} {:>7} {:>16} {:>10}",
            t.topic,
            t.partitions,
            known(t.replication_factor),
            known(t.min_insync_replicas),
            retention(t.retention_ms, t.retention_bytes),
            known(t.unclean_leader_election_enable),
            t.under_replicated_partitions,
            t.leaderless_partitions
        );
    }
    kafka.topics.iter().for_each(|t| topic_notes(out, t));
}

fn topic_notes(out: &mut String, t: &TopicDurability) {
    for r in &t.risks {
        let _ = writeln!(out, "  !! {}: {} {}: {}", t.topic, r.setting, r.value, r.reason);
    }
    if t.under_replicated_partitions > 0 {
        let _ = writeln!(
            out,
            "  !! {}: under-replicated partitions {}: fewer in-sync replicas than replicas, a broker is down or behind",
            t.topic, t.under_replicated_partitions
        );
    }
    if t.leaderless_partitions > 0 {
        let _ = writeln!(out, "  !! {}: partitions without a leader {}: writes to them fail", t.topic, t.leaderless_partitions);
    }
    if let Some(e) = &t.settings_error {
        let _ = writeln!(out, "  {}: settings unknown ({e})", t.topic);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(duration(850), "850ms");
        assert_eq!(duration(12_340), "12.3s");
        assert_eq!(duration(245_000), "4m05s");
        assert_eq!(duration(7_800_000), "2h10m");
    }

    #[test]
    fn unknown_intents_are_called_out_and_zero_is_not() {
        let mut s = Status::default();
        s.notifications.by_status.insert("sent".into(), 3);
        s.notifications.by_status.insert("unknown".into(), 2);
        let text = render(&s);
        let line = text.lines().find(|l| l.trim_start().starts_with("unknown")).unwrap_or_default();
        assert!(line.contains("!!") && line.contains('2'), "{text}");
        s.notifications.by_status.insert("unknown".into(), 0);
        assert!(!render(&s).contains("outcome unknown"));
    }

    #[test]
    fn estimates_are_marked_and_exact_counts_are_not() {
        let mut s = Status::default();
        s.notifications.by_status.insert("sent".into(), 1_200_000);
        s.notifications.by_status.insert("unknown".into(), 3);
        s.notifications.estimated.push("sent".into());
        let text = render(&s);
        assert!(text.contains("~1200000"), "{text}");
        assert!(text.contains("unknown           3"), "{text}");
        assert!(text.contains("counts above 10000 rows are not taken exactly"), "{text}");
        assert!(!render(&Status::default()).contains("estimate"));
    }

    #[test]
    fn topics_show_settings_risks_and_degradations() {
        use crate::durability::{PartitionReplicas, TopicConfigs};
        use crate::figures::KafkaFigures;
        let p = |replicas, in_sync, leader| PartitionReplicas { replicas, in_sync, leader };
        let safe = TopicConfigs {
            min_insync_replicas: Some(2),
            retention_ms: Some(604_800_000),
            unclean_leader_election_enable: Some(false),
            ..TopicConfigs::default()
        };
        let s = Status {
            kafka: Some(KafkaFigures {
                topics: vec![
                    TopicDurability::of("export.commands", &[p(3, 3, Some(1)), p(3, 2, Some(2))], Ok(safe)),
                    TopicDurability::of("export.events", &[p(1, 1, None)], Err("describe configs: unsupported".into())),
                ],
                ..KafkaFigures::default()
            }),
            ..Status::default()
        };
        let text = render(&s);
        let row = |name: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(name) && !l.contains(':'))
                .unwrap_or_default()
                .split_whitespace()
                .collect::<Vec<_>>()
        };
        assert_eq!(row("export.commands"), ["export.commands", "2", "3", "2", "7d", "false", "1", "0"], "{text}");
        assert_eq!(row("export.events"), ["export.events", "1", "1", "?", "?", "?", "0", "1"], "{text}");
        for note in [
            "!! export.events: replication.factor 1: a broker's disk loss can lose acknowledged events",
            "!! export.commands: under-replicated partitions 1",
            "!! export.events: partitions without a leader 1",
            "export.events: settings unknown (describe configs: unsupported)",
        ] {
            assert!(text.contains(note), "missing `{note}`:\n{text}");
        }
        assert!(!text.contains("!! export.commands: replication"), "{text}");
    }

    #[test]
    fn retention_reads_as_days_forever_or_unknown() {
        assert_eq!(retention(Some(604_800_000), None), "7d");
        assert_eq!(retention(Some(-1), Some(1_000)), "forever, 1000B");
        assert_eq!(retention(Some(90_000), None), "1m30s");
        assert_eq!(retention(None, None), "?");
    }
}
