//! `herald drill` as CI runs it: a short drill against the test PostgreSQL
//! server and a three-node Apache Kafka cluster the drill starts itself
//! (from `HERALD_KAFKA_HOME`) and whose brokers it SIGKILLs and restarts;
//! every role a separate process, SIGKILLed at random and restarted. It must
//! end settled, with zero violations and zero notification duplicates, and
//! meet its provider mode's targets: against a slow keyed provider no intent
//! ends `unknown`; against a slow provider without keys, `unknown` intents
//! are no more than the calls that really were ambiguous. Usage errors exit 2.

use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;

/// One drill at a time: each starts three brokers and a dozen processes.
static ONE_DRILL: Mutex<()> = Mutex::new(());

/// Runs a drill with a database password and an API token (the test server
/// trusts local connections, so the password is carried without being
/// checked) at `RUST_LOG=debug`; neither may appear in what it prints.
fn drill(extra: &[&str]) -> Value {
    let server = std::env::var("HERALD_TEST_DATABASE_URL").expect("HERALD_TEST_DATABASE_URL is not set: run the tests with scripts/test");
    let password = format!("dbpw-{}", uuid::Uuid::new_v4().simple());
    let token = format!("tok-{}", uuid::Uuid::new_v4().simple());
    let server = server.replacen("postgres://postgres@", &format!("postgres://postgres:{password}@"), 1);
    assert!(server.contains(&password), "unexpected HERALD_TEST_DATABASE_URL shape: {server}");
    let _one = ONE_DRILL.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["drill", "--kill-every", "2s", "--drain-timeout", "150s", "--json"])
        .args(["--broker-kill-every", "12s", "--broker-down", "3s"])
        .args(["--kafka-home", &kafka_home()])
        .args(extra)
        .env("HERALD_DATABASE_URL", &server)
        .env("HERALD_DRILL_TOKEN", &token)
        .env("RUST_LOG", "debug")
        .env_remove("HERALD_LOG")
        .output()
        .expect("run herald drill");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for secret in [&password, &token] {
        assert!(
            !stdout.contains(secret.as_str()) && !stderr.contains(secret.as_str()),
            "a secret is shown by the drill:\n{stdout}\n{stderr}"
        );
    }
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    assert_eq!(out.status.code(), Some(0), "{report:#}\n{stderr}");
    report
}

fn targets_met(report: &Value) {
    let targets = report["targets"].as_array().expect("targets");
    assert!(targets.len() >= 3 && targets.iter().all(|t| t["met"] == true), "{targets:#?}");
}

fn kafka_home() -> String {
    std::env::var("HERALD_KAFKA_HOME")
        .expect("HERALD_KAFKA_HOME is not set: run the tests with scripts/test, which fetches Apache Kafka and exports its path")
}

#[test]
fn short_drill_against_a_slow_keyed_provider_passes_with_zero_violations() {
    let report = drill(&["--seconds", "45", "--rate", "6", "--provider", "slow-keyed"]);
    assert_eq!(report["passed"], true);
    targets_met(&report);
    assert_eq!(report["intents"]["by_status"]["unknown"], Value::Null, "keyed: nothing unknown after the drain");
    assert!(report["provider"]["ambiguous_calls"].as_u64() > Some(0), "{:#}", report["provider"]);
    assert_eq!(report["settled"], true);
    assert_eq!(report["violations"], 0, "{:#}", report["audit"]);
    assert_eq!(report["notification_duplicates"], 0);
    let broker_kills = report["broker_kills"].as_u64().unwrap_or(0);
    assert!(broker_kills >= 1, "brokers were SIGKILLed: {report:#}");
    assert_eq!(report["broker_restarts"].as_u64(), Some(broker_kills), "every killed broker came back");
    let kills = report["kills"].as_object().expect("kills by role");
    assert!(report["kills_total"].as_u64() >= Some(8) && kills.len() >= 4, "kills spread over roles: {kills:?}");
    let load = &report["load"];
    assert!(load["exports"].as_u64() > Some(100) && load["unanswered"] == 0, "{load:#}");
    assert!(load["repeats_same_job"].as_u64() > Some(0) && load["repeats_same_job"] == load["repeats"], "{load:#}");
    assert!(load["conflicts_409"].as_u64() > Some(0) && load["conflicts_409"] == load["conflicts"], "{load:#}");
    assert!(report["totals"]["jobs_succeeded"].as_u64() > Some(100));
    let checks = report["audit"]["checks"].as_array().expect("audit checks");
    assert_eq!(checks.len(), 11);
    assert!(checks.iter().all(|c| c["ran"] == true && c["checked"].as_u64() > Some(0)), "{checks:#?}");
}

#[test]
fn short_drill_against_a_slow_unkeyed_provider_bounds_unknown_by_ambiguous_calls() {
    let report = drill(&["--seconds", "30", "--rate", "5", "--provider", "slow-unkeyed"]);
    assert_eq!(report["passed"], true);
    targets_met(&report);
    let (provider, intents) = (&report["provider"], &report["intents"]);
    assert_eq!(provider["duplicates"], 0);
    let unanswered = intents["unknown_unanswered"].as_i64().expect("count");
    assert!(unanswered > 0 && unanswered <= provider["ambiguous_calls"].as_i64().unwrap_or(0), "{provider:#}\n{intents:#}");
    assert!(intents["by_status"]["sent"].as_i64() > Some(unanswered), "most intents were sent: {intents:#}");
}

#[test]
fn drill_usage_errors_exit_2() {
    let cases: [&[&str]; 6] = [
        &["drill", "--seconds", "5", "--database", "postgres://127.0.0.1:1/x", "--brokers", "127.0.0.1:1", "--provider", "flaky"],
        &["drill", "--seconds", "5", "--kafka-home", "/nonexistent"],
        &["drill", "--seconds", "5", "--database", "sqlite://x.db", "--kafka-home", "/nonexistent"],
        &["drill", "--seconds", "0", "--database", "postgres://127.0.0.1:1/x", "--kafka-home", "/nonexistent"],
        &["drill", "--seconds", "5", "--database", "postgres://127.0.0.1:1/x"],
        &["drill", "--seconds", "5", "--database", "postgres://127.0.0.1:1/x", "--brokers", "127.0.0.1:1", "--broker-kill-every", "0s"],
    ];
    for args in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(args)
            .env_remove("HERALD_DATABASE_URL")
            .env_remove("HERALD_KAFKA_HOME")
            .output()
            .expect("run herald drill");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("error"), "{args:?} explains itself");
    }
}
