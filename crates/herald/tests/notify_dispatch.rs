//! The lost-acknowledgement windows as tests (ARCHITECTURE.md, "Notifications"):
//! real `herald dispatch` and `herald provider-sim` processes on loopback,
//! SIGKILLed in the window between the provider's commit and Herald's receipt. Intents are seeded straight into PostgreSQL;
//! the notify subscription that creates them is tested elsewhere.

mod notify_support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use herald_fault::Hook;
use herald_notify::dispatcher::{Dispatcher, DispatcherConfig};
use herald_notify::provider::{Capabilities, ProviderClient};
use herald_proof::sim::Ledger;
use herald_store::{Db, now_ms};
use herald_testkit::TestDb;
use serde_json::Value;
use sqlx::Row;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio_util::sync::CancellationToken;

const KEY: &str = "ntf_lost_ack";
const BODY: &str = r#"{"job_id":"j1","text":"your export is ready"}"#;

struct Proc {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Proc {
    fn spawn(args: &[&str], envs: &[(&str, &str)]) -> anyhow::Result<Proc> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(args)
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Ok(Proc { child, lines })
    }

    /// The first stdout line starting with `prefix` — the process's own
    /// signal that it reached a point, instead of a sleep.
    async fn line(&mut self, prefix: &str) -> anyhow::Result<String> {
        let wait = async {
            while let Some(line) = self.lines.next_line().await? {
                if line.starts_with(prefix) {
                    return anyhow::Ok(line);
                }
            }
            anyhow::bail!("process ended before printing `{prefix}`")
        };
        tokio::time::timeout(Duration::from_secs(60), wait).await?
    }

    async fn kill(mut self) -> anyhow::Result<()> {
        self.child.start_kill()?; // SIGKILL
        self.child.wait().await?;
        Ok(())
    }
}

struct Receiver {
    proc: Proc,
    url: String,
}

async fn start_receiver(mode: &str, ledger: &str, listen: &str) -> anyhow::Result<Receiver> {
    let mut proc = Proc::spawn(&["provider-sim", "--mode", mode, "--ledger", ledger, "--listen", listen], &[])?;
    let line = proc.line("provider-sim listening on ").await?;
    let url = line.trim_start_matches("provider-sim listening on ").to_owned();
    Ok(Receiver { proc, url })
}

async fn effects(url: &str) -> anyhow::Result<Value> {
    Ok(reqwest::get(format!("{url}/effects")).await?.json().await?)
}

fn dispatcher(db: &TestDb, url: &str, keyed: bool, fault: bool) -> anyhow::Result<Proc> {
    let keyed = keyed.to_string();
    let mut envs = vec![];
    if fault {
        envs.push(("HERALD_FAULT", "hang:after-provider-response"));
    }
    Proc::spawn(
        &[
            "dispatch",
            "--database",
            &db.url,
            "--notify-url",
            url,
            "--notify-idempotent",
            &keyed,
            "--notify-lease",
            "1500ms",
            "--notify-timeout",
            "1s",
        ],
        &envs,
    )
}

#[derive(Debug)]
struct Intent {
    status: String,
    receipt: Option<String>,
    attempts: i32,
}

async fn intent(db: &Db) -> anyhow::Result<Intent> {
    let row = sqlx::query("SELECT status, receipt, attempts FROM notification_intents WHERE idempotency_key = $1")
        .bind(KEY)
        .fetch_one(db.pool())
        .await?;
    Ok(Intent { status: row.try_get("status")?, receipt: row.try_get("receipt")?, attempts: row.try_get("attempts")? })
}

async fn wait_for(db: &Db, what: &str, done: impl Fn(&Intent) -> bool) -> anyhow::Result<Intent> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = intent(db).await?;
        if done(&now) {
            return Ok(now);
        }
        anyhow::ensure!(Instant::now() < deadline, "never reached {what}: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Setup {
    test_db: TestDb,
    db: Db,
    dir: tempfile::TempDir,
}

async fn setup(body: &str) -> anyhow::Result<Setup> {
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    notify_support::seed_body(&db, KEY, body, now_ms()).await?;
    Ok(Setup { test_db, db, dir: tempfile::tempdir()? })
}

impl Setup {
    fn ledger(&self) -> String {
        self.dir.path().join("ledger.sqlite").display().to_string()
    }

    /// Dispatcher A reaches the provider, the provider commits, A is killed
    /// before it records the receipt.
    async fn crash_after_commit(&self, url: &str, keyed: bool) -> anyhow::Result<()> {
        let mut a = dispatcher(&self.test_db, url, keyed, true)?;
        a.line("herald-fault: hang at after-provider-response").await?;
        a.kill().await?;
        assert_eq!(effects(url).await?["effects"], 1, "the provider executed it once");
        let left = intent(&self.db).await?;
        assert_eq!((left.status.as_str(), left.receipt.as_deref()), ("pending", None), "no receipt was recorded");
        Ok(())
    }
}

fn is_settled(i: &Intent) -> bool {
    i.status != "pending"
}

#[tokio::test(flavor = "multi_thread")]
async fn keyed_dispatcher_killed_after_the_provider_committed() -> anyhow::Result<()> {
    let s = setup(BODY).await?;
    let receiver = start_receiver("keyed", &s.ledger(), "127.0.0.1:0").await?;
    s.crash_after_commit(&receiver.url, true).await?;
    let b = dispatcher(&s.test_db, &receiver.url, true, false)?;
    let done = wait_for(&s.db, "sent", is_settled).await?;
    assert_eq!(done.status, "sent");
    assert!(done.receipt.is_some());
    assert_eq!(effects(&receiver.url).await?["effects"], 1, "the retry with the same key replayed");
    b.kill().await?;
    receiver.proc.kill().await
}

#[tokio::test(flavor = "multi_thread")]
async fn unkeyed_dispatcher_killed_after_the_provider_committed() -> anyhow::Result<()> {
    let s = setup(BODY).await?;
    let receiver = start_receiver("unkeyed", &s.ledger(), "127.0.0.1:0").await?;
    s.crash_after_commit(&receiver.url, false).await?;
    // Recovery does not resend on its own: the outcome is unknown.
    let b = dispatcher(&s.test_db, &receiver.url, false, false)?;
    let left = wait_for(&s.db, "unknown", is_settled).await?;
    assert_eq!((left.status.as_str(), left.receipt.as_deref()), ("unknown", None));
    assert_eq!(effects(&receiver.url).await?["effects"], 1);
    // Herald reports the risk to the operator ...
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["notify", "reconcile", "--database", &s.test_db.url, "--notify-idempotent", "false", "--json"])
        .output()
        .await?;
    assert!(out.status.success());
    let report: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(report["open"][0]["idempotency_key"], KEY);
    assert_eq!(report["open"][0]["resend_may_duplicate"], true);
    // ... who resends anyway: the receiver executes it twice, Herald holds one receipt.
    let resend = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["notify", "reconcile", "--database", &s.test_db.url, "--resend", KEY, "--operator", "test"])
        .output()
        .await?;
    assert!(resend.status.success(), "{}", String::from_utf8_lossy(&resend.stderr));
    let done = wait_for(&s.db, "sent", |i| i.status == "sent").await?;
    assert!(done.receipt.is_some());
    assert_eq!(effects(&receiver.url).await?["effects"], 2, "the duplicate a resend without a key risks");
    b.kill().await?;
    receiver.proc.kill().await
}

#[tokio::test(flavor = "multi_thread")]
async fn keyed_receiver_restarted_too() -> anyhow::Result<()> {
    let s = setup(BODY).await?;
    let receiver = start_receiver("keyed", &s.ledger(), "127.0.0.1:0").await?;
    s.crash_after_commit(&receiver.url, true).await?;
    let addr = receiver.url.trim_start_matches("http://").to_owned();
    receiver.proc.kill().await?;
    let receiver = start_receiver("keyed", &s.ledger(), &addr).await?;
    let b = dispatcher(&s.test_db, &receiver.url, true, false)?;
    let done = wait_for(&s.db, "sent", is_settled).await?;
    assert_eq!(done.status, "sent");
    assert_eq!(effects(&receiver.url).await?["effects"], 1, "the durable ledger replayed after its restart");
    b.kill().await?;
    receiver.proc.kill().await
}

#[tokio::test(flavor = "multi_thread")]
async fn receiver_unavailable_then_back() -> anyhow::Result<()> {
    let s = setup(BODY).await?;
    let spare = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = spare.local_addr()?.to_string();
    drop(spare); // nothing listens here: connections are refused
    let b = dispatcher(&s.test_db, &format!("http://{addr}"), true, false)?;
    let refused = wait_for(&s.db, "a refused attempt", |i| i.attempts >= 1 && i.status == "pending").await?;
    assert_eq!(refused.receipt, None, "no success while the receiver was down");
    let receiver = start_receiver("keyed", &s.ledger(), &addr).await?;
    let done = wait_for(&s.db, "sent", is_settled).await?;
    assert_eq!(done.status, "sent");
    assert!(done.receipt.is_some());
    assert_eq!(effects(&receiver.url).await?["effects"], 1);
    b.kill().await?;
    receiver.proc.kill().await
}

#[tokio::test(flavor = "multi_thread")]
async fn same_key_different_body_already_at_the_receiver() -> anyhow::Result<()> {
    let s = setup(BODY).await?;
    let receiver = start_receiver("keyed", &s.ledger(), "127.0.0.1:0").await?;
    let earlier = reqwest::Client::new()
        .post(format!("{}/v1/notifications", receiver.url))
        .header("idempotency-key", KEY)
        .body(r#"{"job_id":"j1","text":"an older, different message"}"#)
        .send()
        .await?;
    assert_eq!(earlier.status(), 200);
    let b = dispatcher(&s.test_db, &receiver.url, true, false)?;
    let done = wait_for(&s.db, "conflict", is_settled).await?;
    assert_eq!((done.status.as_str(), done.receipt.as_deref()), ("conflict", None), "no success receipt");
    assert_eq!(effects(&receiver.url).await?["effects"], 1, "only the old effect");
    b.kill().await?;
    receiver.proc.kill().await
}

fn in_process(db: &Db, url: &str, lease: Duration, timeout: Duration) -> anyhow::Result<Dispatcher> {
    let client = ProviderClient::new(url, timeout)?;
    let config = DispatcherConfig {
        lease,
        idle_wait: Duration::from_millis(20),
        ..DispatcherConfig::new(Capabilities::keyed(Duration::from_secs(3600)))
    };
    Ok(Dispatcher::new(db.clone(), client, config, Hook::none()))
}

async fn unpause(url: &str) -> anyhow::Result<()> {
    let r = reqwest::Client::new().post(format!("{url}/faults")).body(r#"{"pause": false}"#).send().await?;
    anyhow::ensure!(r.status().is_success());
    Ok(())
}

async fn wait_requests(url: &str, n: i64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while effects(url).await?["requests"].as_i64() != Some(n) {
        anyhow::ensure!(Instant::now() < deadline, "receiver never saw {n} request(s)");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn two_dispatchers_and_a_paused_provider_make_one_call() -> anyhow::Result<()> {
    let s = setup(BODY).await?;
    let mut paused = Proc::spawn(&["provider-sim", "--mode", "keyed", "--ledger", &s.ledger(), "--listen", "127.0.0.1:0", "--pause"], &[])?;
    let url = paused.line("provider-sim listening on ").await?.trim_start_matches("provider-sim listening on ").to_owned();
    let (lease, timeout) = (Duration::from_secs(60), Duration::from_secs(30));
    let (a, b) = (in_process(&s.db, &url, lease, timeout)?, in_process(&s.db, &url, lease, timeout)?);
    let stop = CancellationToken::new();
    let (stop_a, stop_b) = (stop.clone(), stop.clone());
    let run_a = tokio::spawn(async move { a.run(stop_a).await });
    let run_b = tokio::spawn(async move { b.run(stop_b).await });
    wait_requests(&url, 1).await?;
    unpause(&url).await?;
    wait_for(&s.db, "sent", is_settled).await?;
    stop.cancel();
    run_a.await?;
    run_b.await?;
    assert_eq!(effects(&url).await?["requests"], 1, "one provider call in total");
    paused.kill().await
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelled_before_acceptance_keeps_the_lease_then_is_reclaimed_with_the_same_key() -> anyhow::Result<()> {
    let s = setup(BODY).await?;
    let mut paused = Proc::spawn(&["provider-sim", "--mode", "keyed", "--ledger", &s.ledger(), "--listen", "127.0.0.1:0", "--pause"], &[])?;
    let url = paused.line("provider-sim listening on ").await?.trim_start_matches("provider-sim listening on ").to_owned();
    // The held call must not time out before the test cancels it.
    let (lease, timeout) = (Duration::from_secs(3), Duration::from_secs(2));
    let a = in_process(&s.db, &url, lease, timeout)?;
    let stop_a = CancellationToken::new();
    let run_a = {
        let stop = stop_a.clone();
        tokio::spawn(async move { a.run(stop).await })
    };
    wait_requests(&url, 1).await?;
    stop_a.cancel(); // shutdown while the call is held at the provider
    run_a.await?;
    let row = sqlx::query("SELECT claim_token, claim_expires_at_ms FROM notification_intents WHERE idempotency_key = $1")
        .bind(KEY)
        .fetch_one(s.db.pool())
        .await?;
    let token: Option<String> = row.try_get("claim_token")?;
    let expires: i64 = row.try_get("claim_expires_at_ms")?;
    assert!(token.is_some(), "the cancelled call's claim is kept");
    let b = in_process(&s.db, &url, lease, timeout)?;
    assert_eq!(b.dispatch_once(&CancellationToken::new()).await?, 0, "nobody reclaims before the lease expires");
    while now_ms() <= expires {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stop_b = CancellationToken::new();
    let run_b = {
        let stop = stop_b.clone();
        tokio::spawn(async move { b.run(stop).await })
    };
    wait_requests(&url, 2).await?;
    unpause(&url).await?;
    let done = wait_for(&s.db, "sent", is_settled).await?;
    stop_b.cancel();
    run_b.await?;
    assert_eq!(done.status, "sent");
    let ledger = Ledger::open(&s.ledger()).await?;
    assert_eq!(ledger.requests_of(KEY).await?, 2, "both calls carried the same key");
    assert_eq!(effects(&url).await?["effects"], 1);
    paused.kill().await
}

#[tokio::test(flavor = "multi_thread")]
async fn reconcile_asks_a_queryable_provider_about_unknown_intents() -> anyhow::Result<()> {
    let s = setup(BODY).await?;
    notify_support::seed_body(&s.db, "ntf_never_arrived", BODY, now_ms()).await?;
    // Both first attempted just now: well inside the provider's key retention.
    sqlx::query(&format!(
        "UPDATE notification_intents SET status = 'unknown', attempts = 1, may_have_executed = 1, first_attempt_at_ms = {}",
        s.db.now_sql()
    ))
    .execute(s.db.pool())
    .await?;
    let receiver = start_receiver("keyed", &s.ledger(), "127.0.0.1:0").await?;
    // The provider did get KEY (the answer was lost), never the other one.
    let accepted =
        reqwest::Client::new().post(format!("{}/v1/notifications", receiver.url)).header("idempotency-key", KEY).body(BODY).send().await?;
    assert_eq!(accepted.status(), 200);
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["notify", "reconcile", "--database", &s.test_db.url, "--notify-url", &receiver.url, "--json"])
        .args(["--notify-idempotent", "true", "--notify-queryable", "true"])
        .output()
        .await?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(report["asked_provider"]["confirmed_sent"], 1);
    assert_eq!(report["asked_provider"]["requeued"], 1, "not at the provider: safe to send again with its key");
    let confirmed = intent(&s.db).await?;
    assert_eq!(confirmed.status, "sent");
    assert!(confirmed.receipt.is_some_and(|r| r.starts_with("rcpt_")), "the provider's receipt, not a guess");
    let requeued: String = sqlx::query("SELECT status FROM notification_intents WHERE idempotency_key = 'ntf_never_arrived'")
        .fetch_one(s.db.pool())
        .await?
        .try_get("status")?;
    assert_eq!(requeued, "pending");
    // Bad input: an unknown key to decide on is a usage error.
    let bad = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["notify", "reconcile", "--database", &s.test_db.url, "--mark-sent", "ntf_nope"])
        .output()
        .await?;
    assert_eq!(bad.status.code(), Some(2));
    receiver.proc.kill().await
}
