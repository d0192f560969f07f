//! The table and the JSON of `herald bench peers`.

use std::collections::HashMap;
use std::time::Instant;

use serde_json::{Value, json};

use super::topic::Drained;

/// One system's figures.
pub(super) struct System {
    pub drained: Drained,
    pub cpu_per_100k: f64,
    /// Local PostgreSQL's CPU over the same window (`None`: not local).
    pub pg_cpu_per_100k: Option<f64>,
    pub peak_rss_mb: f64,
    pub latencies: Vec<Latency>,
}

/// Commit → readable at one offered rate.
pub(super) struct Latency {
    pub rate: u64,
    pub sent: u64,
    pub seen: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    pub fn of(rate: u64, committed: &HashMap<u64, Instant>, seen: &[(u64, Instant)]) -> Latency {
        let ms = super::latencies_ms(committed, seen);
        let at = |q: f64| if ms.is_empty() { f64::NAN } else { ms[((ms.len() - 1) as f64 * q).round() as usize] };
        Latency { rate, sent: committed.len() as u64, seen: ms.len() as u64, p50_ms: at(0.5), p99_ms: at(0.99), max_ms: at(1.0) }
    }
}

fn round(x: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (x * f).round() / f
}

pub(super) fn to_json(broker: &str, events: u64, herald: &System, debezium: &System, settings: &[String]) -> Value {
    let mut out = json!({
        "broker": broker, "events": events, "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "herald_eps": herald.drained.eps().round(), "debezium_eps": debezium.drained.eps().round(),
        "eps_ratio": round(herald.drained.eps() / debezium.drained.eps(), 2),
        "herald_rss_mb": round(herald.peak_rss_mb, 1), "debezium_rss_mb": round(debezium.peak_rss_mb, 1),
        "rss_ratio": round(herald.peak_rss_mb / debezium.peak_rss_mb, 3),
        "herald_cpu_s_per_100k": round(herald.cpu_per_100k, 2), "debezium_cpu_s_per_100k": round(debezium.cpu_per_100k, 2),
        "cpu_ratio": round(herald.cpu_per_100k / debezium.cpu_per_100k, 2),
        "herald_pg_cpu_s_per_100k": herald.pg_cpu_per_100k.map(|x| round(x, 2)),
        "debezium_pg_cpu_s_per_100k": debezium.pg_cpu_per_100k.map(|x| round(x, 2)),
        "herald_records": herald.drained.records, "debezium_records": debezium.drained.records,
        "herald_out_of_order": herald.drained.out_of_order, "debezium_out_of_order": debezium.drained.out_of_order,
        "herald_duplicates": herald.drained.duplicates, "debezium_duplicates": debezium.drained.duplicates,
        "debezium_settings": settings,
    });
    for (h, d) in herald.latencies.iter().zip(&debezium.latencies) {
        let rate = h.rate;
        for (who, l) in [("herald", h), ("debezium", d)] {
            out[format!("{who}_p50_ms_{rate}")] = json!(round(l.p50_ms, 1));
            out[format!("{who}_p99_ms_{rate}")] = json!(round(l.p99_ms, 1));
            out[format!("{who}_max_ms_{rate}")] = json!(round(l.max_ms, 1));
            out[format!("{who}_seen_{rate}")] = json!(l.seen);
            out[format!("{who}_sent_{rate}")] = json!(l.sent);
        }
        out[format!("p99_ratio_{rate}")] = json!(round(h.p99_ms / d.p99_ms, 2));
    }
    out
}

pub(super) fn print(json: bool, broker: &str, events: u64, herald: &System, debezium: &System, settings: &[String]) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(&to_json(broker, events, herald, debezium, settings))?);
        return Ok(());
    }
    println!("broker: {broker}; backlog of {events} events; {} CPUs\n", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0));
    println!("| | Herald relay | Debezium (Connect) | Herald ÷ Debezium | target |");
    println!("|---|---:|---:|---:|---|");
    let (h, d) = (herald.drained.eps(), debezium.drained.eps());
    println!("| backlog drain, events/s | {h:.0} | {d:.0} | {:.2} | ≥ 2 {} |", h / d, met(h / d >= 2.0));
    for (hl, dl) in herald.latencies.iter().zip(&debezium.latencies) {
        let target = if hl.rate == 1_000 { format!("≤ 1 {}", met(hl.p99_ms <= dl.p99_ms)) } else { String::new() };
        println!(
            "| commit → readable at {} events/s, p50 / p99 / max ms | {:.1} / {:.1} / {:.1} | {:.1} / {:.1} / {:.1} | p99 {:.2} | {target} |",
            hl.rate,
            hl.p50_ms,
            hl.p99_ms,
            hl.max_ms,
            dl.p50_ms,
            dl.p99_ms,
            dl.max_ms,
            hl.p99_ms / dl.p99_ms
        );
    }
    let (hr, dr) = (herald.peak_rss_mb, debezium.peak_rss_mb);
    println!("| peak RSS, MB | {hr:.1} | {dr:.1} | {:.3} | ≤ 0.2 {} |", hr / dr, met(hr / dr <= 0.2));
    let (hc, dc) = (herald.cpu_per_100k, debezium.cpu_per_100k);
    println!("| CPU seconds per 100k events (drain), the process | {hc:.2} | {dc:.2} | {:.2} | |", hc / dc);
    if let (Some(hp), Some(dp)) = (herald.pg_cpu_per_100k, debezium.pg_cpu_per_100k) {
        println!("| CPU seconds per 100k events (drain), PostgreSQL | {hp:.2} | {dp:.2} | {:.2} | |", hp / dp);
    }
    for (who, s) in [("Herald", herald), ("Debezium", debezium)] {
        let d = &s.drained;
        println!(
            "\n{who}: {} records on its topic ({} of the backlog, each once or more), {} out of per-key order, {} duplicates",
            d.records, d.backlog_records, d.out_of_order, d.duplicates
        );
        for l in &s.latencies {
            println!("{who} at {} events/s: {} of {} events read", l.rate, l.seen, l.sent);
        }
    }
    println!("\nDebezium settings (everything not Connect's or Debezium's default):");
    for s in settings {
        println!("  {s}");
    }
    Ok(())
}

fn met(yes: bool) -> &'static str {
    if yes { "met" } else { "NOT met" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn latency_is_read_minus_commit_by_event_number() {
        let t0 = Instant::now();
        let committed: HashMap<u64, Instant> = (0..100).map(|n| (n, t0)).collect();
        let seen: Vec<(u64, Instant)> = (0..100).map(|n| (n, t0 + Duration::from_millis(n + 1))).chain([(1000, t0)]).collect();
        let l = Latency::of(1000, &committed, &seen);
        assert_eq!((l.sent, l.seen), (100, 100), "an event not committed in the phase is not a sample");
        assert!((l.p50_ms - 51.0).abs() < 1.01 && (l.max_ms - 100.0).abs() < 0.01, "{} {}", l.p50_ms, l.max_ms);
    }
}
