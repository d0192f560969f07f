//! `herald bench search` end to end on a small scale, so the command
//! BENCHMARKS.md reruns keeps working: its searches are answered over real
//! HTTP and checked, its relay runs drain their rows, and the JSON carries
//! the figures the section quotes.

use std::process::Command;

#[test]
fn the_search_benchmark_runs_and_reports_its_figures() -> anyhow::Result<()> {
    let server = std::env::var(herald_testkit::DATABASE_URL_ENV)?;
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["bench", "search", "--documents", "3000", "--callers", "10", "--searches", "50", "--clients", "3"])
        .args(["--relay-events", "1000", "--json", "--database", &server])
        .env("HERALD_LOG", "error")
        .env_remove("HERALD_KAFKA_BROKERS")
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let figures: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(figures["documents"], 3000);
    for key in ["search_p50_ms", "search_p99_ms", "relay_quiet_eps", "relay_flood_ratio", "relay_one_caller_flood_ratio"] {
        assert!(figures[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {figures}");
    }
    assert_eq!(figures["search_by_kind"].as_object().map(|k| k.len()), Some(5), "{figures}");
    let flood = &figures["runs"]["flood_many_callers"];
    let answered = flood["searches_per_sec"].as_f64().unwrap_or(0.0) + flood["limited_per_sec"].as_f64().unwrap_or(0.0);
    assert!(answered > 0.0, "the flood searched: {flood}");
    Ok(())
}
