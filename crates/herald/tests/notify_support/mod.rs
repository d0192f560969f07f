//! Shared pieces of the notification tests: a database per test on either
//! backend, seeded intents, in-process dispatchers, and a test provider that
//! can answer from a script, hold calls until released, and witness — from
//! the database, at the moment each call arrives and again when it is
//! answered — whether the caller's claim was live.

#![allow(dead_code, unused_macros)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use herald_fault::Hook;
use herald_notify::dispatcher::{Dispatcher, DispatcherConfig};
use herald_notify::provider::{Capabilities, ProviderClient};
use herald_proof::sim::{Applied, Ledger};
use herald_store::Db;
use herald_testkit::TestDb;
use sqlx::Row;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// Runs `$body(Backend)` as one test per database.
macro_rules! on_both {
    ($name:ident, $body:expr) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread")]
            async fn postgres() -> anyhow::Result<()> {
                $body(Backend::Postgres).await
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn sqlite() -> anyhow::Result<()> {
                $body(Backend::Sqlite).await
            }
        }
    };
}

pub const BODY: &str = r#"{"job_id":"j1","text":"your export is ready"}"#;

pub async fn test_db(backend: Backend) -> anyhow::Result<TestDb> {
    match backend {
        Backend::Postgres => herald_testkit::postgres_db().await,
        Backend::Sqlite => herald_testkit::sqlite_db(),
    }
}

/// A migrated database; keep the `TestDb` alive as long as the `Db`.
pub async fn database(backend: Backend) -> anyhow::Result<(TestDb, Db)> {
    let test_db = test_db(backend).await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    Ok((test_db, db))
}

/// A pending intent; `created` orders claims (oldest first).
pub async fn seed(db: &Db, key: &str, created: i64) -> anyhow::Result<()> {
    seed_body(db, key, BODY, created).await
}

/// A pending intent with `body`.
pub async fn seed_body(db: &Db, key: &str, body: &str, created: i64) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO notification_intents (idempotency_key, source, event_id, recipient, kind, job_id, body, status, \
         created_at_ms, updated_at_ms) VALUES ($1, '/herald/exports', $1, 'alice', 'export.completed', 'j1', $2, 'pending', $3, $3)",
    )
    .bind(key)
    .bind(body)
    .bind(created)
    .execute(db.pool())
    .await?;
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentRow {
    pub status: String,
    pub attempts: i32,
    pub claim_token: Option<String>,
    pub claim_expires_at_ms: Option<i64>,
    pub first_attempt_at_ms: Option<i64>,
    pub next_attempt_at_ms: i64,
    pub last_error: Option<String>,
    pub receipt: Option<String>,
    pub resolved_by: Option<String>,
}

pub async fn row(db: &Db, key: &str) -> anyhow::Result<IntentRow> {
    let r = sqlx::query(
        "SELECT status, attempts, claim_token, claim_expires_at_ms, first_attempt_at_ms, next_attempt_at_ms, last_error, \
         receipt, resolved_by FROM notification_intents WHERE idempotency_key = $1",
    )
    .bind(key)
    .fetch_one(db.pool())
    .await?;
    Ok(IntentRow {
        status: r.try_get("status")?,
        attempts: r.try_get("attempts")?,
        claim_token: r.try_get("claim_token")?,
        claim_expires_at_ms: r.try_get("claim_expires_at_ms")?,
        first_attempt_at_ms: r.try_get("first_attempt_at_ms")?,
        next_attempt_at_ms: r.try_get("next_attempt_at_ms")?,
        last_error: r.try_get("last_error")?,
        receipt: r.try_get("receipt")?,
        resolved_by: r.try_get("resolved_by")?,
    })
}

pub async fn db_now(db: &Db) -> anyhow::Result<i64> {
    Ok(herald_notify::claims::db_now(db).await?)
}

/// Waits until the database's clock passes `at_ms` — a condition on the
/// clock leases are measured by, not a guess at how long something takes.
pub async fn until_db_time(db: &Db, at_ms: i64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while db_now(db).await? <= at_ms {
        anyhow::ensure!(Instant::now() < deadline, "database clock never reached {at_ms}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Makes a scheduled retry due now, instead of waiting for its backoff.
pub async fn make_due(db: &Db, key: &str) -> anyhow::Result<()> {
    sqlx::query("UPDATE notification_intents SET next_attempt_at_ms = 0 WHERE idempotency_key = $1").bind(key).execute(db.pool()).await?;
    Ok(())
}

pub fn dispatcher(db: &Db, url: &str, caps: Capabilities, lease: Duration, timeout: Duration, batch: i64) -> anyhow::Result<Dispatcher> {
    let client = ProviderClient::new(url, timeout)?;
    let config = DispatcherConfig { lease, batch, idle_wait: Duration::from_millis(20), ..DispatcherConfig::new(caps) };
    Ok(Dispatcher::new(db.clone(), client, config, Hook::none()))
}

/// A canned answer.
#[derive(Debug, Clone)]
pub struct Scripted {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
}

impl Scripted {
    pub fn status(status: u16) -> Scripted {
        Scripted { status, headers: Vec::new() }
    }

    pub fn retry_after(status: u16, seconds: u64) -> Scripted {
        Scripted { status, headers: vec![("retry-after", seconds.to_string())] }
    }
}

/// What the database said about the caller's intent while it called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSeen {
    pub token: Option<String>,
    /// The claim's expiry is after the database's now.
    pub live: bool,
}

#[derive(Debug, Clone)]
pub struct Call {
    pub key: String,
    pub body: String,
    pub at_arrival: ClaimSeen,
    /// `None`: the caller went away before the answer.
    pub at_answer: Option<ClaimSeen>,
}

struct Shared {
    witness: Db,
    ledger: Ledger,
    keyed: bool,
    script: Mutex<VecDeque<Scripted>>,
    held: Mutex<bool>,
    permits: Semaphore,
    calls: Mutex<Vec<Call>>,
    arrivals: mpsc::UnboundedSender<String>,
}

/// A provider on loopback: keyed or unkeyed effects in a simulator ledger,
/// scripted answers first, calls held while paused.
pub struct TestProvider {
    pub url: String,
    shared: Arc<Shared>,
    arrivals: tokio::sync::Mutex<mpsc::UnboundedReceiver<String>>,
    stop: CancellationToken,
    _dir: tempfile::TempDir,
}

impl TestProvider {
    /// `witness`: a database URL to read claims from (its own pool, as the
    /// provider is another party).
    pub async fn start(witness_url: &str, keyed: bool, paused: bool) -> anyhow::Result<TestProvider> {
        let dir = tempfile::tempdir()?;
        let ledger = Ledger::open(&dir.path().join("ledger.sqlite").display().to_string()).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            witness: Db::connect(witness_url).await?,
            ledger,
            keyed,
            script: Mutex::new(VecDeque::new()),
            held: Mutex::new(paused),
            permits: Semaphore::new(0),
            calls: Mutex::new(Vec::new()),
            arrivals: tx,
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let app = axum::Router::new().route("/v1/notifications", post(notify)).with_state(shared.clone());
        let stop = CancellationToken::new();
        let until = stop.clone();
        tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(async move { until.cancelled().await }).await });
        Ok(TestProvider { url, shared, arrivals: tokio::sync::Mutex::new(rx), stop, _dir: dir })
    }

    pub fn script(&self, answers: impl IntoIterator<Item = Scripted>) {
        lock(&self.shared.script).extend(answers);
    }

    /// The key of the next call to arrive.
    pub async fn next_arrival(&self) -> anyhow::Result<String> {
        let mut rx = self.arrivals.lock().await;
        let key = tokio::time::timeout(Duration::from_secs(60), rx.recv()).await?;
        key.ok_or_else(|| anyhow::anyhow!("provider stopped"))
    }

    /// Lets one held call go on.
    pub fn release_one(&self) {
        self.shared.permits.add_permits(1);
    }

    /// Lets every held and future call go on.
    pub fn open(&self) {
        *lock(&self.shared.held) = false;
        self.shared.permits.add_permits(Semaphore::MAX_PERMITS / 2);
    }

    pub fn calls(&self) -> Vec<Call> {
        lock(&self.shared.calls).clone()
    }

    pub async fn effects_of(&self, key: &str) -> anyhow::Result<i64> {
        Ok(self.shared.ledger.effects_of(key).await?)
    }
}

impl Drop for TestProvider {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn claim_seen(db: &Db, key: &str) -> ClaimSeen {
    let sql = format!(
        "SELECT claim_token, CASE WHEN claim_expires_at_ms > {} THEN 1 ELSE 0 END AS live FROM notification_intents WHERE idempotency_key = $1",
        db.now_sql()
    );
    match sqlx::query(&sql).bind(key).fetch_one(db.pool()).await {
        Ok(r) => ClaimSeen { token: r.try_get("claim_token").ok().flatten(), live: r.try_get::<i32, _>("live").is_ok_and(|l| l == 1) },
        Err(e) => ClaimSeen { token: Some(format!("witness failed: {e}")), live: false },
    }
}

async fn notify(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let body = String::from_utf8_lossy(&body).into_owned();
    let at_arrival = claim_seen(&shared.witness, &key).await;
    let index = {
        let mut calls = lock(&shared.calls);
        calls.push(Call { key: key.clone(), body: body.clone(), at_arrival, at_answer: None });
        calls.len() - 1
    };
    let _ = shared.arrivals.send(key.clone());
    let held = *lock(&shared.held);
    if held {
        if let Ok(permit) = shared.permits.acquire().await {
            permit.forget();
        }
    }
    let at_answer = claim_seen(&shared.witness, &key).await;
    lock(&shared.calls)[index].at_answer = Some(at_answer);
    let scripted = lock(&shared.script).pop_front();
    if let Some(answer) = scripted {
        let mut response = (StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), "scripted").into_response();
        for (name, value) in answer.headers {
            if let Ok(value) = value.parse() {
                response.headers_mut().insert(name, value);
            }
        }
        return response;
    }
    let since = if shared.keyed { Some(0) } else { None };
    match shared.ledger.apply(Some(&key), &body, since, herald_store::now_ms()).await {
        Ok(Applied::Executed { receipt } | Applied::Replayed { receipt }) => {
            axum::Json(serde_json::json!({ "receipt": receipt })).into_response()
        }
        Ok(Applied::Conflict) => (StatusCode::CONFLICT, "key taken").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}
