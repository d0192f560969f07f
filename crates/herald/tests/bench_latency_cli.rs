//! `herald bench latency` end to end on a small scale against the real
//! three-node cluster, so the command BENCHMARKS.md reruns keeps working: the
//! bench itself fails unless every event appended reached the search inbox
//! and every outbox row was delivered; here the JSON must carry each load's
//! percentiles and stages, in order. No figure is judged: speed is the
//! benchmark's business, not a test's.

use std::process::Command;
use std::time::Duration;

use herald_testkit::kafka::topics_starting_with;

#[tokio::test(flavor = "multi_thread")]
async fn the_latency_benchmark_runs_the_pipeline_and_reports_each_stage_real_broker() -> anyhow::Result<()> {
    let server = std::env::var(herald_testkit::DATABASE_URL_ENV)?;
    let brokers = herald_testkit::real_broker()?;
    let before = topics_starting_with(&brokers, "latency-")?;
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args([
            "bench",
            "latency",
            "--rates",
            "100,400",
            "--seconds",
            "2",
            "--lanes",
            "3",
            "--warm-up",
            "1",
            "--json",
            "--database",
            &server,
            "--kafka",
            &brokers,
        ])
        .env("HERALD_LOG", "error")
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let figures: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(figures["subscription_lanes"], 3, "{figures}");
    // A discarded load at the highest rate first (by default only on a cluster the benchmark started).
    assert_eq!(figures["warm_up_seconds"], 1, "{figures}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("warming the pipeline up: 400 events/s for 1 s"), "{stderr}");
    let rates = figures["rates"].as_array().expect("rates");
    assert_eq!(rates.iter().map(|r| r["rate"].as_u64()).collect::<Vec<_>>(), [Some(100), Some(400)], "{figures}");
    for load in rates {
        assert!(load["events"].as_u64().is_some_and(|n| n > 0), "{load}");
        assert!(load["probes"].as_u64().is_some_and(|n| n > 0), "{load}");
        let [p50, p99, max] = ["p50_ms", "p99_ms", "max_ms"].map(|k| load[k].as_f64().unwrap_or(-1.0));
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{load}");
        for stage in ["commit_to_topic", "topic_to_visible", "raw_send_to_readable"] {
            let s = &load["stages"][stage];
            assert!(s["samples"].as_u64().is_some_and(|n| n > 0), "{stage} in {load}");
            assert!(s["p99_ms"].as_f64().is_some_and(|v| v >= 0.0), "{stage} in {load}");
        }
        let subscription = &load["subscription_per_batch"];
        assert!(subscription["batches"].as_u64().is_some_and(|n| n > 0), "{load}");
        assert!(subscription["records"].as_f64().is_some_and(|n| n >= 1.0), "{load}");
        assert!(subscription["stages"]["transaction_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{load}");
    }
    // Each load's topics are gone: a cluster serving many runs would slow down under them.
    let gone = || async { Ok(topics_starting_with(&brokers, "latency-")? == before) };
    herald_testkit::wait_until("the benchmark's topics to be deleted", Duration::from_secs(30), gone).await
}
