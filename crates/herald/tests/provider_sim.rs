//! The reference receiver's fault switches, as a real `herald provider-sim`
//! process: commit then exit (the caller's connection breaks after the
//! effect), refusing connections for a while, for real, and the slow mode of
//! the adversarial drill, whose count of ambiguous calls the drill's targets
//! rest on — including requests the simulator was killed on before it
//! executed them.

use std::process::Stdio;
use std::time::Duration;

use herald_notify::provider::{NO_ANSWER, ProviderClient, SendOutcome};
use herald_proof::sim::Ledger;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

async fn start(ledger: &str, extra: &[&str]) -> anyhow::Result<(Child, String)> {
    start_mode("keyed", ledger, extra).await
}

async fn start_mode(mode: &str, ledger: &str, extra: &[&str]) -> anyhow::Result<(Child, String)> {
    let mut args = vec!["provider-sim", "--mode", mode, "--ledger", ledger, "--listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut child = Command::new(env!("CARGO_BIN_EXE_herald")).args(&args).stdout(Stdio::piped()).kill_on_drop(true).spawn()?;
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await??.unwrap_or_default();
    let url = line.trim_start_matches("provider-sim listening on ").to_owned();
    anyhow::ensure!(url.starts_with("http://"), "unexpected first line: {line}");
    Ok((child, url))
}

async fn post(url: &str, key: &str) -> Result<reqwest::Response, reqwest::Error> {
    reqwest::Client::new().post(format!("{url}/v1/notifications")).header("idempotency-key", key).body("{}").send().await
}

#[tokio::test(flavor = "multi_thread")]
async fn exit_after_commit_breaks_the_connection_after_the_effect() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = dir.path().join("ledger.sqlite").display().to_string();
    let (mut child, url) = start(&ledger, &["--exit-after-commit"]).await?;
    let err = post(&url, "k1").await.expect_err("no answer: the process exited after committing");
    assert!(!err.is_connect(), "the request was sent; the answer was lost: {err}");
    assert_eq!(child.wait().await?.code(), Some(86));
    // Restarted on the same ledger, it remembers the key: the retry replays.
    let (mut again, url) = start(&ledger, &[]).await?;
    let replay: Value = post(&url, "k1").await?.json().await?;
    assert_eq!(replay["replayed"], true);
    let totals: Value = reqwest::get(format!("{url}/effects")).await?.json().await?;
    assert_eq!((totals["effects"].as_i64(), totals["requests"].as_i64()), (Some(1), Some(2)));
    assert_eq!(totals["ambiguous"].as_i64(), Some(1), "the call the process died in counts as ambiguous, the replay does not");
    let kinds: Value = reqwest::get(format!("{url}/effects/ambiguous")).await?.json().await?;
    assert_eq!(kinds, serde_json::json!({"unanswered": 1}));
    again.start_kill()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn refusing_connections_closes_the_socket_then_reopens_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut child, url) = start(&dir.path().join("ledger.sqlite").display().to_string(), &[]).await?;
    let set = reqwest::Client::new().post(format!("{url}/faults")).body(r#"{"refuse_for_ms": 1500}"#).send().await?;
    assert_eq!(set.status(), 204);
    // Refused (not reset, not hanging) while the switch holds ...
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match post(&url, "k2").await {
            Err(e) if e.is_connect() => break,
            _ => {
                anyhow::ensure!(tokio::time::Instant::now() < deadline, "connections were never refused");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    // ... and accepted again afterwards, on the same address.
    loop {
        match post(&url, "k2").await {
            Ok(answer) => {
                assert_eq!(answer.status(), 200);
                break;
            }
            Err(e) => anyhow::ensure!(tokio::time::Instant::now() < deadline, "never reopened: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.start_kill()?;
    Ok(())
}

/// Every call the dispatcher's client could not read an answer to is one the
/// slow simulator counts as ambiguous under its key; the rest were answered.
/// Sixty sequential calls: the chance that none draws a late answer or a
/// dropped connection (a fifth of the draws) is 0.8^60, about 1e-6.
#[tokio::test(flavor = "multi_thread")]
async fn the_slow_simulator_counts_every_call_its_caller_heard_no_answer_to() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger_path = dir.path().join("ledger.sqlite").display().to_string();
    let timeout = Duration::from_millis(300);
    let (mut child, url) = start_mode("unkeyed", &ledger_path, &["--slow-around", "300ms"]).await?;
    let client = ProviderClient::new(&url, timeout)?;
    let (mut unanswered, mut accepted) = (Vec::new(), 0);
    for i in 0..60 {
        let key = format!("k{i}");
        match client.send(&key, "{}", None).await {
            SendOutcome::Accepted { .. } => accepted += 1,
            SendOutcome::Unknown { .. } => unanswered.push(key),
            other => anyhow::bail!("call {key}: a slow provider still answers or goes silent, got {other:?}"),
        }
    }
    let ledger = Ledger::open(&ledger_path).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while ledger.requests_unsettled().await? > 0 {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "late calls never finished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(accepted > 0 && !unanswered.is_empty(), "{accepted} accepted, {} unanswered: the mix is a draw of shares", unanswered.len());
    for key in &unanswered {
        assert_eq!(ledger.ambiguous_calls_of(key).await?, 1, "{key}: the client heard no answer, the simulator must count it");
    }
    let totals = ledger.totals().await?;
    assert_eq!(totals.effects, 60, "unkeyed: every call executed, also those answered late or cut");
    assert!(totals.ambiguous >= i64::try_from(unanswered.len())?, "{totals:?}");
    let kinds: std::collections::BTreeMap<String, i64> = reqwest::get(format!("{url}/effects/ambiguous")).await?.json().await?;
    assert!(kinds.keys().all(|k| ["late", "dropped", "caller_gone"].contains(&k.as_str())), "{kinds:?}");
    child.start_kill()?;
    Ok(())
}

/// A request counts from its arrival, not from its execution: held by
/// `--pause`, then SIGKILLed with it, it executed nothing, yet its caller saw
/// the connection end without an answer — so the ledger, reopened by the
/// next simulator, counts it ambiguous.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_the_simulator_dies_on_before_executing_it_is_ambiguous() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = dir.path().join("ledger.sqlite").display().to_string();
    let (mut child, url) = start_mode("unkeyed", &ledger, &["--pause"]).await?;
    // The timeout only bounds the test: the kill must end the call first.
    let client = ProviderClient::new(&url, Duration::from_secs(20))?;
    let call = tokio::spawn(async move { client.send("held", "{}", None).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while requests_of(&url, "held").await?["requests"] != 1 {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the request never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.start_kill()?;
    child.wait().await?;
    match call.await? {
        SendOutcome::Unknown { reason } => {
            assert!(reason.starts_with(&format!("{NO_ANSWER}:")), "the connection ended, no timeout: {reason}");
        }
        other => anyhow::bail!("the caller must not know what happened, got {other:?}"),
    }
    let (mut again, url) = start_mode("unkeyed", &ledger, &[]).await?;
    let totals: Value = reqwest::get(format!("{url}/effects")).await?.json().await?;
    assert_eq!(
        (totals["effects"].as_i64(), totals["requests"].as_i64(), totals["ambiguous"].as_i64()),
        (Some(0), Some(1), Some(1)),
        "{totals}"
    );
    let kinds: Value = reqwest::get(format!("{url}/effects/ambiguous")).await?.json().await?;
    assert_eq!(kinds, serde_json::json!({"unanswered": 1}));
    assert_eq!(requests_of(&url, "held").await?, serde_json::json!({"requests": 1, "ambiguous": 1}));
    assert_eq!(requests_of(&url, "never-sent").await?, serde_json::json!({"requests": 0, "ambiguous": 0}));
    again.start_kill()?;
    Ok(())
}

async fn requests_of(url: &str, key: &str) -> anyhow::Result<Value> {
    Ok(reqwest::get(format!("{url}/requests/{key}")).await?.error_for_status()?.json().await?)
}
