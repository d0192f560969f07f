//! The reference receiver's fault switches, as a real `herald provider-sim`
//! process: commit then exit (the caller's connection breaks after the
//! effect), and refusing connections for a while, for real.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

async fn start(ledger: &str, extra: &[&str]) -> anyhow::Result<(Child, String)> {
    let mut args = vec!["provider-sim", "--mode", "keyed", "--ledger", ledger, "--listen", "127.0.0.1:0"];
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
