//! `herald outbox list|redrive` and the relay's usage errors, as an
//! operator runs them.

use std::process::{Command, Output};

use herald_store::Db;

fn herald(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_herald")).args(args).env("HERALD_LOG", "warn").output().expect("run herald")
}

#[tokio::test(flavor = "multi_thread")]
async fn list_and_redrive_set_aside_rows() -> anyhow::Result<()> {
    let test_db = herald_testkit::sqlite_db()?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    for (id, status) in [("e-1", "dead_lettered"), ("e-2", "delivered"), ("e-3", "failed")] {
        sqlx::query(
            "INSERT INTO outbox (event_id, source, event_type, subject, event_time_ms, schema_file, data, topic, \
             partition_key, status, attempts, last_error, created_at_ms) \
             VALUES ($1, '/t', 'herald.test', 'k', 0, 'f', $2, 'topic', 'k', $3, 3, 'broker said no', 0)",
        )
        .bind(id)
        .bind(b"x".to_vec())
        .bind(status)
        .execute(db.pool())
        .await?;
    }
    db.close().await;
    let url = test_db.url.as_str();

    let out = herald(&["outbox", "list", "--status", "dead_lettered", "--json", "--database", url]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout).lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["id"], "e-1");
    assert_eq!(lines[0]["last_error"], "broker said no");

    let out = herald(&["outbox", "redrive", "--status", "dead_lettered", "--database", url]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = herald(&["outbox", "list", "--status", "pending", "--json", "--database", url]);
    let pending = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(pending.contains("\"e-1\"") && !pending.contains("\"e-3\""), "{pending}");
    assert!(
        String::from_utf8_lossy(&herald(&["outbox", "list", "--status", "dead_lettered", "--database", url]).stdout).lines().count() == 1,
        "only the header left"
    );

    // A delivered row is not redriven; asking for it is an error, not a silent no-op.
    let out = herald(&["outbox", "redrive", "--seq", "2", "--database", url]);
    assert_eq!(out.status.code(), Some(1));
    Ok(())
}

#[test]
fn usage_errors_exit_with_status_2() {
    for args in [
        &["relay"][..],
        &["relay", "--database", "sqlite://x", "--kafka", "127.0.0.1:1", "--lease-ms", "0"],
        &["relay", "--batch-size", "zero"],
        &["relay", "--database", "sqlite://x", "--kafka", "127.0.0.1:1", "--producer", "linger.ms"],
        &["relay", "--database", "sqlite://x", "--kafka", "127.0.0.1:1", "--producer", "linger.mss=0"],
        &["bench", "relay", "--relay-producer", "linger.ms"],
        &["outbox", "list", "--status", "lost", "--database", "sqlite://x"],
        &["outbox", "list", "--status", "pending"],
        &["outbox", "redrive", "--status", "delivered", "--database", "sqlite://x"],
        &["outbox", "redrive", "--database", "sqlite://x"],
        &["bench", "relay", "--events", "10"],
        &["bench", "relay", "--database", "sqlite://x"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(args)
            .env_remove("HERALD_DATABASE_URL")
            .env_remove("HERALD_KAFKA_BROKERS")
            .output()
            .expect("run herald");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(!out.stderr.is_empty(), "{args:?} explains itself");
    }
}
