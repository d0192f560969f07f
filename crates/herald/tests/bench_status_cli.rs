//! `herald bench status` end to end on a small scale, so the command
//! BENCHMARKS.md reruns keeps working: it fills the tables, checks that a
//! refresh reports what it wrote (the bench fails otherwise), and the JSON
//! carries the figures the section quotes.

use std::process::Command;

#[test]
fn the_status_benchmark_runs_and_reports_its_figures() -> anyhow::Result<()> {
    let server = std::env::var(herald_testkit::DATABASE_URL_ENV)?;
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["bench", "status", "--outbox", "20000", "--intents", "5000", "--refreshes", "3", "--json", "--database", &server])
        .env("HERALD_LOG", "error")
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let figures: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!((figures["outbox_rows"].as_u64(), figures["figures_checked"].as_bool()), (Some(20_000), Some(true)), "{figures}");
    for key in ["refresh_p50_ms", "refresh_max_ms", "whole_table_scan_p50_ms", "speedup"] {
        assert!(figures[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {figures}");
    }
    assert_eq!(figures["parts"].as_object().map(|p| p.len()), Some(6), "{figures}");
    Ok(())
}
