//! `herald bench relay` and `herald bench consume` measure the memory of a
//! role as users run it: a `herald relay` / `herald consume search` process
//! of its own draining a backlog, sampled at each tenth of it. Small here,
//! so the commands BENCHMARKS.md reruns keep working and report the keys.

use std::process::Command;

fn bench(args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let server = std::env::var(herald_testkit::DATABASE_URL_ENV)?;
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["bench"])
        .args(args)
        .args(["--json", "--database", &server])
        .env("HERALD_LOG", "error")
        .env_remove("HERALD_KAFKA_BROKERS")
        .output()?;
    anyhow::ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn check(figures: &serde_json::Value, peak: &str, memory: &str) {
    let peak_mb = figures[peak].as_f64().unwrap_or_default();
    // A Rust process with a database pool and a Kafka client: more than a
    // few MB, far less than a GB.
    assert!(peak_mb > 5.0 && peak_mb < 1024.0, "{peak} in {figures}");
    let tenths = figures[memory]["rss_mb_by_tenth"].as_array().map(Vec::len);
    assert_eq!(tenths, Some(10), "{memory} in {figures}");
}

#[test]
fn bench_relay_reports_the_relay_process_memory() -> anyhow::Result<()> {
    let figures = bench(&["relay", "--events", "2000", "--naive-events", "100", "--memory-events", "20000"])?;
    check(&figures, "relay_peak_rss_mb", "relay_memory");
    // The floor moved the same backlog (it fails the run unless it read
    // every pending row), and its ratios are reported beside Herald's.
    let floor = figures["floor_relay_eps"].as_f64().unwrap_or(0.0);
    assert!(floor > 0.0, "floor_relay_eps in {figures}");
    assert!(figures["floor_vs_raw"].as_f64().is_some() && figures["relay_vs_floor"].as_f64().is_some(), "{figures}");
    Ok(())
}

#[test]
fn bench_consume_reports_the_subscription_process_memory() -> anyhow::Result<()> {
    let figures = bench(&["consume", "--events", "2000", "--rounds", "1", "--memory-events", "20000"])?;
    check(&figures, "consume_peak_rss_mb", "consume_memory");
    Ok(())
}
