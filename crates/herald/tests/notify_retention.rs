//! Reconciliation and the provider's key retention (how long it remembers
//! an idempotency key): `not found` proves "never executed" only while the provider
//! would still remember the key. The simulator forgets executed keys after
//! its retention, so once it has, a 404 for an intent it did execute must
//! leave that intent `unknown` with the reason — a resend would be a second
//! effect — while an intent first attempted inside the retention is requeued.

#[macro_use]
mod notify_support;

use std::process::Command;
use std::time::{Duration, Instant};

use herald_notify::provider::Capabilities;
use herald_proof::sim::{self, FaultSwitches, Ledger, SimConfig};
use herald_store::Db;
use notify_support::{BODY, Backend, database, dispatcher, row, seed};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const RETENTION: Duration = Duration::from_secs(3);

/// An intent whose last attempt's outcome was lost, first attempted now.
async fn unknown_since_now(db: &Db, key: &str) -> anyhow::Result<()> {
    sqlx::query(&format!(
        "UPDATE notification_intents SET status = 'unknown', attempts = 1, may_have_executed = 1, first_attempt_at_ms = {} \
         WHERE idempotency_key = $1",
        db.now_sql()
    ))
    .bind(key)
    .execute(db.pool())
    .await?;
    Ok(())
}

async fn forgotten(url: &str, key: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while reqwest::get(format!("{url}/v1/notifications/{key}")).await?.status() != 404 {
        anyhow::ensure!(Instant::now() < deadline, "the simulator never forgot {key}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn reconcile(db_url: &str, provider: &str) -> anyhow::Result<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["notify", "reconcile", "--database", db_url, "--notify-url", provider, "--json"])
        .args(["--notify-idempotent", "true", "--notify-queryable", "true", "--notify-key-retention", "3s"])
        .env_remove("HERALD_DATABASE_URL")
        .output()?;
    anyhow::ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Ok(serde_json::from_slice(&out.stdout)?)
}

async fn not_found_past_retention(backend: Backend) -> anyhow::Result<()> {
    let (test_db, db) = database(backend).await?;
    let dir = tempfile::tempdir()?;
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite").display().to_string()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let stop = CancellationToken::new();
    tokio::spawn(sim::serve(listener, ledger.clone(), SimConfig::keyed(RETENTION), FaultSwitches::default(), stop.clone()));

    // The provider executed `ntf_executed`; Herald never got the answer.
    seed(&db, "ntf_executed", 1).await?;
    unknown_since_now(&db, "ntf_executed").await?;
    let accepted =
        reqwest::Client::new().post(format!("{url}/v1/notifications")).header("idempotency-key", "ntf_executed").body(BODY).send().await?;
    assert_eq!(accepted.status(), 200);
    forgotten(&url, "ntf_executed").await?;
    // `ntf_recent` was first attempted just now and never reached the provider.
    seed(&db, "ntf_recent", 2).await?;
    unknown_since_now(&db, "ntf_recent").await?;

    let report = reconcile(&test_db.url, &url)?;
    assert_eq!(report["asked_provider"]["requeued"], 1, "{report:#}");
    assert_eq!(report["asked_provider"]["past_retention"], 1, "{report:#}");
    let stays = row(&db, "ntf_executed").await?;
    assert_eq!(stays.status, "unknown", "not found past retention proves nothing");
    assert!(stays.last_error.as_deref().is_some_and(|e| e.contains("retention")), "with the reason: {stays:?}");
    let open = report["open"].as_array().cloned().unwrap_or_default();
    assert!(open.iter().any(|o| o["idempotency_key"] == "ntf_executed" && o["resend_may_duplicate"] == true), "{report:#}");
    assert_eq!(row(&db, "ntf_recent").await?.status, "pending", "inside retention: provably never executed");

    let d = dispatcher(&db, &url, Capabilities::keyed(RETENTION), Duration::from_secs(10), Duration::from_secs(5), 10)?;
    assert_eq!(d.dispatch_once(&CancellationToken::new()).await?, 1);
    assert_eq!(row(&db, "ntf_recent").await?.status, "sent");
    assert_eq!(ledger.effects_of("ntf_executed").await?, 1, "never executed twice");
    assert_eq!(ledger.effects_of("ntf_recent").await?, 1);
    stop.cancel();
    Ok(())
}

on_both!(reconcile_requeues_not_found_only_inside_key_retention, not_found_past_retention);
