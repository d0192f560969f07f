//! The search benchmark's figures: two tables, or one JSON object.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use super::search::SearchBenchArgs;
use super::search_load::{Kind, percentile_ms};

/// The relay's target under a search flood, as a share of its quiet rate.
const TARGET_RATIO: f64 = 0.8;

/// One relay run and the searches beside it.
#[derive(Debug, Clone, Copy)]
pub struct FloodRun {
    pub relay_eps: f64,
    pub searches_per_sec: f64,
    pub limited_per_sec: f64,
    pub shed_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

pub struct Figures {
    pub load_secs: f64,
    /// The sequential client's latencies per kind, sorted.
    pub sequential: BTreeMap<Kind, Vec<Duration>>,
    /// Quiet, flooded by many callers, flooded by one caller, quiet.
    pub runs: Vec<FloodRun>,
}

impl Figures {
    fn quiet_eps(&self) -> f64 {
        (self.runs[0].relay_eps + self.runs[3].relay_eps) / 2.0
    }

    fn ratio(&self, run: usize) -> f64 {
        self.runs[run].relay_eps / self.quiet_eps()
    }

    fn all_sequential(&self) -> Vec<Duration> {
        let mut all: Vec<Duration> = self.sequential.values().flatten().copied().collect();
        all.sort_unstable();
        all
    }
}

pub fn emit(args: &SearchBenchArgs, figures: &Figures) -> anyhow::Result<()> {
    if args.json {
        println!("{}", serde_json::to_string(&as_json(args, figures))?);
    } else {
        print_tables(args, figures);
    }
    Ok(())
}

fn round(v: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (v * scale).round() / scale
}

fn as_json(args: &SearchBenchArgs, f: &Figures) -> serde_json::Value {
    let all = f.all_sequential();
    let kinds: serde_json::Map<String, serde_json::Value> = f
        .sequential
        .iter()
        .map(|(kind, l)| {
            (format!("{kind:?}"), json!({"p50_ms": round(percentile_ms(l, 50.0), 2), "p99_ms": round(percentile_ms(l, 99.0), 2)}))
        })
        .collect();
    let run = |r: &FloodRun| {
        json!({"relay_eps": r.relay_eps.round(), "searches_per_sec": r.searches_per_sec.round(), "limited_per_sec": r.limited_per_sec.round(), "shed_per_sec": r.shed_per_sec.round(),
               "search_p50_ms": round(r.p50_ms, 2), "search_p99_ms": round(r.p99_ms, 2)})
    };
    json!({
        "documents": args.documents, "callers": args.callers, "clients": args.clients, "relay_events": args.relay_events,
        "load_secs": round(f.load_secs, 1),
        "search_p50_ms": round(percentile_ms(&all, 50.0), 2), "search_p99_ms": round(percentile_ms(&all, 99.0), 2),
        "search_max_ms": round(percentile_ms(&all, 100.0), 2), "search_by_kind": kinds,
        "relay_quiet_eps": f.quiet_eps().round(),
        "relay_flood_ratio": round(f.ratio(1), 2), "relay_one_caller_flood_ratio": round(f.ratio(2), 2),
        "runs": {"quiet_before": run(&f.runs[0]), "flood_many_callers": run(&f.runs[1]), "flood_one_caller": run(&f.runs[2]), "quiet_after": run(&f.runs[3])},
        "broker": args.kafka.brokers.as_deref().unwrap_or("in-process mock cluster"),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    })
}

fn print_tables(args: &SearchBenchArgs, f: &Figures) {
    println!(
        "{} documents of {} callers ({} each), loaded and analysed in {:.1} s; broker: {}\n",
        args.documents,
        args.callers,
        args.documents / args.callers,
        f.load_secs,
        args.kafka.brokers.as_deref().unwrap_or("in-process mock cluster")
    );
    println!("| GET /v1/search, one client, one at a time | searches | p50 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|");
    let row = |label: &str, l: &[Duration]| {
        println!(
            "| {label} | {} | {:.2} | {:.2} | {:.2} |",
            l.len(),
            percentile_ms(l, 50.0),
            percentile_ms(l, 99.0),
            percentile_ms(l, 100.0)
        );
    };
    for (kind, latencies) in &f.sequential {
        row(kind.label(), latencies);
    }
    row("**all**", &f.all_sequential());
    println!();
    println!(
        "| relay run ({} events each) | relay events/s | vs quiet | searches answered/s | 429/s | 503/s | search p50 ms | search p99 ms |",
        args.relay_events
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let labels = [
        "quiet (before)".to_owned(),
        format!("{} clients of {} callers searching", args.clients, args.clients.min(args.callers)),
        format!("{} clients of one caller searching", args.clients),
        "quiet (after)".to_owned(),
    ];
    for (i, (label, run)) in labels.iter().zip(&f.runs).enumerate() {
        let searches = if i == 0 || i == 3 {
            "| – | – | – | – | – |".to_owned()
        } else {
            format!(
                "| {:.0} | {:.0} | {:.0} | {:.2} | {:.2} |",
                run.searches_per_sec, run.limited_per_sec, run.shed_per_sec, run.p50_ms, run.p99_ms
            )
        };
        println!("| {label} | {:.0} | {:.2} {searches}", run.relay_eps, f.ratio(i));
    }
    println!();
    let verdict = |r: f64| if r >= TARGET_RATIO { "meets" } else { "misses" };
    println!(
        "relay under the many-caller flood = {:.0} % of its quiet rate (mean of both quiet runs), {} the {:.0} % target; one-caller flood: {:.0} %",
        f.ratio(1) * 100.0,
        verdict(f.ratio(1)),
        TARGET_RATIO * 100.0,
        f.ratio(2) * 100.0
    );
}
