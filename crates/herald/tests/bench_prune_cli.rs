//! `herald bench prune` end to end on a small scale, so the command
//! BENCHMARKS.md reruns keeps working: both prunes must remove every old row
//! the fill wrote (the bench fails otherwise), and the JSON carries the
//! figures the section quotes. `--hold-prune` holds each prune at its last
//! table until the "during" rounds are done (a lock, not a race: at this
//! size the prune could otherwise end first, and the bench fails then).

use std::process::Command;

#[test]
fn the_prune_benchmark_runs_and_reports_its_figures() -> anyhow::Result<()> {
    let server = std::env::var(herald_testkit::DATABASE_URL_ENV)?;
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args([
            "bench",
            "prune",
            "--rows",
            "20000",
            "--events",
            "1000",
            "--prune-batch",
            "10",
            "--hold-prune",
            "--json",
            "--database",
            &server,
        ])
        .env("HERALD_LOG", "error")
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let figures: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(figures["rows_per_prune"].as_u64(), Some(40_000), "{figures}");
    assert_eq!(figures["prune_held"].as_bool(), Some(true), "{figures}");
    for key in ["relay_prune_reached_hold", "consume_prune_reached_hold"] {
        assert!(figures[key].is_boolean(), "{key} in {figures}");
    }
    for key in [
        "relay_quiet_eps",
        "relay_during_prune_eps",
        "relay_during_vs_quiet",
        "relay_best_during_vs_quiet",
        "consume_quiet_eps",
        "consume_during_prune_eps",
        "consume_during_vs_quiet",
        "consume_best_during_vs_quiet",
    ] {
        assert!(figures[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {figures}");
    }
    for key in ["relay_quiet_rounds", "relay_during_rounds", "consume_quiet_rounds", "consume_during_rounds"] {
        let rounds = figures[key].as_array().map_or(0, Vec::len);
        assert_eq!(rounds, 3, "{key} in {figures}");
    }
    Ok(())
}
