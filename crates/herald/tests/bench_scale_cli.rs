//! `herald bench scale` on a small scale against the real three-node
//! cluster, so the command BENCHMARKS.md reruns keeps working: each round
//! runs real `herald relay` and `herald consume search` processes until the
//! backlog is delivered (or applied), and each process reports its share
//! when it stops. The shares must add up — every row delivered by one relay,
//! every record applied by one member — and each round must have as many
//! shares as processes. No rate is judged: speed is the benchmark's
//! business, not a test's.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use herald_testkit::kafka::topics_starting_with;

/// The topics `bench scale` names: its relay rounds' and its consume rounds'.
fn scale_topics(brokers: &str) -> anyhow::Result<BTreeSet<String>> {
    let mut topics = topics_starting_with(brokers, "bench.scale-relay-")?;
    topics.extend(topics_starting_with(brokers, "bench-scale-")?);
    Ok(topics)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_scale_benchmark_runs_each_process_count_and_the_shares_add_up_real_broker() -> anyhow::Result<()> {
    let server = std::env::var(herald_testkit::DATABASE_URL_ENV)?;
    let brokers = herald_testkit::real_broker()?;
    let before = scale_topics(&brokers)?;
    let events = 3000u64;
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args([
            "bench",
            "scale",
            "--events",
            &events.to_string(),
            "--processes",
            "1,2",
            "--json",
            "--database",
            &server,
            "--kafka",
            &brokers,
            // Passed to every relay as `--producer` (not the relay's default,
            // which is 1); one librdkafka refused would fail the round.
            "--relay-producer",
            "max.in.flight.requests.per.connection=2",
        ])
        .env("HERALD_LOG", "error")
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let figures: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(figures["partitions"].as_u64(), Some(8), "{figures}");
    for role in ["relay", "consume"] {
        let rounds = figures[role].as_array().unwrap_or_else(|| panic!("{role} rounds in {figures}"));
        assert_eq!(rounds.iter().map(|r| r["processes"].as_u64()).collect::<Vec<_>>(), [Some(1), Some(2)], "{figures}");
        for round in rounds {
            assert!(round["eps"].as_f64().is_some_and(|eps| eps > 0.0), "{role}: {round}");
            let shares = round["per_process"].as_array().unwrap_or_else(|| panic!("{role}: {round}"));
            assert_eq!(shares.len() as u64, round["processes"].as_u64().unwrap_or(0), "{role}: one share per process: {round}");
            let total: u64 = shares.iter().map(|s| s.as_u64().unwrap_or_else(|| panic!("{role}: a process did not report: {round}"))).sum();
            assert_eq!(total, events, "{role}: every event done once, by one process: {round}");
        }
    }
    // Each round's topics are gone: a cluster serving many runs would slow down under them.
    let gone = || async { Ok(scale_topics(&brokers)? == before) };
    herald_testkit::wait_until("the benchmark's topics to be deleted", Duration::from_secs(30), gone).await
}
