//! `herald bench relay`, `consume` and `rebuild` given a real cluster
//! (`--kafka`) create topics of the run's own there, and delete them when
//! the run is done: a cluster that serves run after run otherwise slows down
//! under idle partitions, and later runs on it measure less than the code
//! does (BENCHMARKS.md, "Two batches out: faster alone, not in company").

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use herald_testkit::kafka::topics_starting_with;

/// Topics named by these benchmarks: the relay's `bench.events-…`, and
/// consume's and rebuild's `bench-<run>…` (scale's `bench-scale-…` too,
/// whose own test runs in another binary, never at the same time).
fn bench_topics(brokers: &str) -> anyhow::Result<BTreeSet<String>> {
    topics_starting_with(brokers, "bench")
}

fn bench(server: &str, brokers: &str, args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .arg("bench")
        .args(args)
        .args(["--json", "--database", server, "--kafka", brokers, "--partitions", "4"])
        .env("HERALD_LOG", "error")
        .output()?;
    anyhow::ensure!(out.status.success(), "herald bench {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(serde_json::from_slice(&out.stdout)?)
}

#[tokio::test(flavor = "multi_thread")]
async fn relay_consume_and_rebuild_delete_their_topics_from_a_real_cluster_real_broker() -> anyhow::Result<()> {
    let server = std::env::var(herald_testkit::DATABASE_URL_ENV)?;
    let brokers = herald_testkit::real_broker()?;
    let before = bench_topics(&brokers)?;
    let runs: [&[&str]; 3] = [
        &["relay", "--events", "2000", "--naive-events", "100", "--memory-events", "0"],
        &["consume", "--events", "2000", "--rounds", "1", "--memory-events", "0"],
        // With copies: the live subscription, the replay and its seal's
        // settling of jobs loaded twice all run, and the rebuild must still
        // switch with one document a job.
        &["rebuild", "--events", "2000", "--duplicate-every", "10"],
    ];
    for args in runs {
        let figures = bench(&server, &brokers, args)?;
        // The run was on the cluster given, not on the mock.
        assert!(figures["broker"].as_str().is_some_and(|b| b.contains(&brokers)), "{args:?}: {figures}");
        // The floors ran too (each fails the run unless it moved every row).
        let floor = match args[0] {
            "relay" => Some("floor_relay_eps"),
            "rebuild" => Some("write_floor_eps"),
            _ => None,
        };
        if let Some(key) = floor {
            assert!(figures[key].as_f64().unwrap_or(0.0) > 0.0, "{key}: {figures}");
        }
        if args[0] == "rebuild" {
            assert_eq!(figures["records"], 2200, "every tenth of 2000 events published twice: {figures}");
        }
        let gone = || async { Ok(bench_topics(&brokers)? == before) };
        herald_testkit::wait_until(&format!("the topics of bench {} to be deleted", args[0]), Duration::from_secs(30), gone).await?;
    }
    Ok(())
}
