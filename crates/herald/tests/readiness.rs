//! `GET /readyz` on a real pipeline (PostgreSQL, librdkafka's mock cluster,
//! HTTP on loopback): 200 with every role running and both dependencies
//! answering; 503 problem+json naming the broker while it is down, and the
//! database while it refuses connections; 200 again when each comes back.
//! `/healthz` stays 200 throughout (alive, just not ready). Faults are real:
//! the mock broker taken down, the database closed to connections and its
//! sessions terminated.

use std::time::Duration;

use herald::pipeline::{self, RoleOptions, Roles, Wiring};
use herald_api::Tokens;
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_store::Db;
use herald_testkit::unique;
use serde_json::Value;
use sqlx::{Connection, Executor, PgConnection};

const WITHIN: Duration = Duration::from_secs(60);

async fn readyz(base: &str) -> anyhow::Result<(u16, Value)> {
    let response = reqwest::get(format!("{base}/readyz")).await?;
    Ok((response.status().as_u16(), response.json().await?))
}

/// Opens or closes the test database to new connections, and ends the
/// sessions it has, as a failover or an operator would.
async fn set_connections(url: &str, allowed: bool) -> anyhow::Result<()> {
    let server = std::env::var(herald_testkit::DATABASE_URL_ENV)?;
    let name = url.rsplit('/').next().unwrap_or_default().to_owned();
    let mut admin = PgConnection::connect(&server).await?;
    admin.execute(format!("ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS {allowed}").as_str()).await?;
    if !allowed {
        admin.execute(format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'").as_str()).await?;
    }
    admin.close().await?;
    Ok(())
}

/// Polls `/readyz` until it answers `status` (the probe's result is fresh
/// for a second, so a change shows within about that), or fails.
async fn wait_for(base: &str, status: u16, what: &str) -> anyhow::Result<Value> {
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        let (code, body) = readyz(base).await?;
        if code == status {
            return Ok(body);
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "timed out waiting for {what}; last answer {code} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ready_while_the_database_the_broker_and_every_role_answer() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let topics = Topics::with_prefix(&unique("ready"));
    let kafka = EmbeddedKafka::start(1, &topics.all(), 2)?;
    let artifacts = tempfile::tempdir()?;
    let wiring = Wiring {
        db,
        kafka: KafkaConfig::new(kafka.bootstrap_servers()),
        topics,
        group_prefix: unique("herald"),
        artifacts: artifacts.path().display().to_string(),
        tokens: Tokens::single("t", "alice"),
    };
    let roles = Roles { dispatcher: false, ..Roles::all("127.0.0.1:0") };
    let running = pipeline::start_roles(wiring, roles, RoleOptions::default()).await?;
    let base = format!("http://{}", running.api_addr.expect("the API role runs"));

    let ready = wait_for(&base, 200, "ready").await?;
    assert_eq!(ready["dependencies"], serde_json::json!({"broker": "ok", "database": "ok"}), "{ready}");
    let roles: Vec<&str> = ready["roles"].as_object().expect("roles").keys().map(String::as_str).collect();
    for role in ["api", "status", "relay", "scanner", "artifact-cleanup", "export-worker", "search", "stats", "notify"] {
        assert!(roles.contains(&role), "{role} in {ready}");
        assert_eq!(ready["roles"][role], "running", "{ready}");
    }

    kafka.broker_down(1)?;
    let down = wait_for(&base, 503, "not ready while the broker is down").await?;
    assert_eq!(down["type"], "/problems/unready", "{down}");
    let detail = down["detail"].as_str().unwrap_or_default();
    assert!(detail.starts_with("broker: not answering (see log "), "{down}");
    assert!(!detail.contains("database"), "the database still answers: {down}");
    assert_eq!(reqwest::get(format!("{base}/healthz")).await?.status(), 200, "alive all the same");
    kafka.broker_up(1)?;
    wait_for(&base, 200, "ready again with the broker back").await?;

    set_connections(&test_db.url, false).await?;
    let down = wait_for(&base, 503, "not ready while the database refuses connections").await?;
    assert!(down["detail"].as_str().is_some_and(|d| d.contains("database: not answering (see log ")), "{down}");
    set_connections(&test_db.url, true).await?;
    wait_for(&base, 200, "ready again with the database back").await?;

    running.stop().await
}
