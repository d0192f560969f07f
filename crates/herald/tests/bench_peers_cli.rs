//! `herald bench peers` end to end on a small scale, so the comparison
//! BENCHMARKS.md reruns keeps working: Herald's relay and Debezium's outbox
//! router (Kafka Connect standalone, from HERALD_DEBEZIUM_HOME, which
//! scripts/test fetches) drain the same backlog from the test PostgreSQL
//! (wal_level=logical) to the three-node cluster. The bench itself fails
//! unless every backlog event is on both topics and each topic was read
//! back in full; this test checks the figures the section quotes, per-key
//! order on both topics, and the refusals.

use std::process::Command;

fn herald(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.args(["bench", "peers"]).args(args).env("HERALD_LOG", "error").env_remove("HERALD_DATABASE_URL");
    cmd
}

#[test]
fn herald_and_debezium_drain_the_same_backlog_and_are_measured_alike() -> anyhow::Result<()> {
    let server = std::env::var(herald_testkit::DATABASE_URL_ENV)?;
    let brokers = herald_testkit::real_broker()?;
    let home = std::env::var("HERALD_DEBEZIUM_HOME").map_err(|_| anyhow::anyhow!("HERALD_DEBEZIUM_HOME (scripts/debezium-fetch)"))?;
    let args = ["--events", "3000", "--rates", "200", "--secs", "2", "--partitions", "4", "--json"];
    let out = herald(&args).args(["--database", &server, "--kafka", &brokers, "--debezium-home", &home]).output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let figures: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    for key in [
        "herald_eps",
        "debezium_eps",
        "herald_p99_ms_200",
        "debezium_p99_ms_200",
        "herald_rss_mb",
        "debezium_rss_mb",
        "eps_ratio",
        "rss_ratio",
    ] {
        assert!(figures[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {figures}");
    }
    for who in ["herald", "debezium"] {
        assert_eq!(figures[format!("{who}_out_of_order")], 0, "{who}: per-key order on its topic: {figures}");
        assert_eq!(figures[format!("{who}_seen_200")], figures[format!("{who}_sent_200")], "{who}: every latency event read: {figures}");
    }
    // The backlog, two markers and the latency phase's 400 events, on each topic.
    assert_eq!(figures["herald_records"].as_u64(), figures["debezium_records"].as_u64(), "{figures}");
    assert!(figures["herald_records"].as_u64().is_some_and(|n| n >= 3_401), "{figures}");
    Ok(())
}

#[test]
fn without_a_server_or_the_jars_it_is_refused_with_exit_2() -> anyhow::Result<()> {
    let out = herald(&["--events", "100"]).output()?;
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--database"));
    let server = std::env::var(herald_testkit::DATABASE_URL_ENV)?;
    let empty = tempfile::tempdir()?;
    let out = herald(&["--database", &server, "--debezium-home", &empty.path().display().to_string()]).output()?;
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("debezium-fetch") || String::from_utf8_lossy(&out.stderr).contains("--debezium-home")
    );
    Ok(())
}
