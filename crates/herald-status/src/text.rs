//! `herald status` for people: one section per part of the pipeline, with
//! what needs a person called out (`!!`).

use std::fmt::Write;

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

/// The whole status as a table. Every `writeln!` goes to a `String`, which
/// cannot fail, so the results are ignored.
pub fn render(s: &Status) -> String {
    let mut out = String::new();
    let o = &s.outbox;
    let _ = writeln!(out, "herald status ({})", s.backend);
    let _ = writeln!(out, "\nOUTBOX");
    let _ = writeln!(out, "  backlog {:>8}   oldest pending {}", o.backlog, opt_duration(o.oldest_pending_age_ms));
    let _ = writeln!(out, "  pending {:>8}   retryable_failed {}   failed {}   dead_lettered {}", o.pending, o.retryable_failed, o.failed, o.dead_lettered);
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
    let _ = writeln!(out, "  {:<10} {:<28} {:>8} {:>10} {:>12} {:>9}", "name", "group", "lag", "inbox", "dead letters", "redriven");
    for sub in &s.subscriptions {
        let lag = sub.lag.map_or_else(|| "?".into(), |l| l.to_string());
        let group = sub.group.as_deref().unwrap_or("-");
        let flag = if sub.dead_letters > 0 { "  !!" } else { "" };
        let _ = writeln!(out, "  {:<10} {:<28} {:>8} {:>10} {:>12} {:>9}{flag}", sub.name, group, lag, sub.inbox_rows, sub.dead_letters, sub.redriven);
    }
    if let Some(e) = &s.kafka_error {
        let _ = writeln!(out, "  lag unknown: {e}");
    }
    let _ = writeln!(out, "\nNOTIFICATION INTENTS");
    if s.notifications.by_status.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for (status, n) in &s.notifications.by_status {
        let flag = if status == "unknown" && *n > 0 { "  !! outcome unknown: herald notify reconcile" } else { "" };
        let _ = writeln!(out, "  {status:<10} {n:>8}{flag}");
    }
    let j = &s.jobs;
    let _ = writeln!(out, "\nEXPORT JOBS");
    for (status, n) in &j.by_status {
        let _ = writeln!(out, "  {status:<10} {n:>8}");
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
        let _ = writeln!(out, "  {:<8} g{:<4} {:<12} {:>8} documents{active}", g.projection, g.generation, g.state, g.documents);
    }
    out
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
}
