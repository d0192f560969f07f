//! `--log-format json` (or `HERALD_LOG_FORMAT=json`): every log line a
//! long-running command writes is one JSON object with its level, target,
//! message and fields; `text` stays the default; another value is a usage
//! error (exit 2). Runs `herald serve` on its embedded default.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// stderr lines of `herald serve` up to the relay's start line.
async fn serve_logs(args: &[&str], envs: &[(&str, &str)]) -> anyhow::Result<Vec<String>> {
    let tmp = tempfile::tempdir()?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .envs(envs.iter().copied())
        .env("TMPDIR", tmp.path())
        .env("HERALD_LOG", "info")
        .env_remove("HERALD_DATABASE_URL")
        .env_remove("HERALD_KAFKA_BROKERS")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut seen = Vec::new();
    let read = async {
        while let Some(line) = lines.next_line().await? {
            let started = line.contains("relay started");
            seen.push(line);
            if started {
                return anyhow::Ok(());
            }
        }
        anyhow::bail!("serve ended before its relay started: {seen:?}")
    };
    tokio::time::timeout(Duration::from_secs(120), read).await??;
    child.kill().await?;
    Ok(seen)
}

#[tokio::test(flavor = "multi_thread")]
async fn json_logs_are_one_object_per_line() -> anyhow::Result<()> {
    for (args, envs) in [(&["--log-format", "json"][..], &[][..]), (&[][..], &[("HERALD_LOG_FORMAT", "json")][..])] {
        let lines = serve_logs(args, envs).await?;
        for line in &lines {
            let object: serde_json::Value = serde_json::from_str(line).map_err(|e| anyhow::anyhow!("{e}: {line}"))?;
            for key in ["timestamp", "level", "target", "message"] {
                assert!(object[key].is_string(), "{key} in {line}");
            }
        }
        let relay = lines.last().expect("the relay's line");
        let relay: serde_json::Value = serde_json::from_str(relay)?;
        assert_eq!((relay["level"].as_str(), relay["target"].as_str()), (Some("INFO"), Some("herald_relay::relay")), "{relay}");
        assert!(relay["owner"].is_string() && relay["batch"].is_u64(), "fields are top-level members: {relay}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn text_is_the_default_and_other_formats_are_refused() -> anyhow::Result<()> {
    let lines = serve_logs(&[], &[]).await?;
    assert!(lines.iter().all(|l| serde_json::from_str::<serde_json::Value>(l).is_err()), "{lines:?}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_herald")).args(["serve", "--log-format", "xml"]).output()?;
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--log-format"));
    Ok(())
}

/// The ids of a JSON line's span: every line has them, collector or not.
fn ids(line: &serde_json::Value) -> (String, String) {
    let text = |key: &str| line["openTelemetry"][key].as_str().unwrap_or_default().to_owned();
    let (trace, span) = (text("traceId"), text("spanId"));
    assert!(trace.len() == 32 && span.len() == 16, "trace and span ids in {line}");
    (trace, span)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_json_line_carries_trace_ids_even_librdkafkas_and_the_exit_error() -> anyhow::Result<()> {
    let lines = serve_logs(&["--log-format", "json"], &[]).await?;
    for line in &lines {
        ids(&serde_json::from_str(line)?);
    }

    // librdkafka logs on its own threads, outside any span; its lines join the
    // command's span. A relay on a port nobody listens on logs them at once.
    let tmp = tempfile::tempdir()?;
    let db = format!("sqlite:{}", tmp.path().join("h.db").display());
    let herald = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
        cmd.env("HERALD_LOG", "info").env_remove("OTEL_EXPORTER_OTLP_ENDPOINT").stdout(Stdio::null()).stderr(Stdio::piped());
        cmd
    };
    let migrated = herald().args(["migrate", "--database", &format!("{db}?mode=rwc")]).output().await?;
    assert!(migrated.status.success(), "{}", String::from_utf8_lossy(&migrated.stderr));
    let mut relay =
        herald().args(["relay", "--log-format", "json", "--database", &db, "--kafka", "127.0.0.1:1"]).kill_on_drop(true).spawn()?;
    let mut stderr = BufReader::new(relay.stderr.take().expect("stderr")).lines();
    let (mut librdkafka, mut started) = (None, None);
    let read = async {
        while let Some(line) = stderr.next_line().await? {
            let line: serde_json::Value = serde_json::from_str(&line).map_err(|e| anyhow::anyhow!("{e}: {line}"))?;
            let message = line["message"].as_str().unwrap_or_default();
            if message.starts_with("librdkafka:") {
                librdkafka.get_or_insert(ids(&line));
            } else if message == "relay started" {
                started = Some(ids(&line));
            }
            if librdkafka.is_some() && started.is_some() {
                return anyhow::Ok(());
            }
        }
        anyhow::bail!("the relay ended before logging a librdkafka line and its start")
    };
    tokio::time::timeout(Duration::from_secs(120), read).await??;
    relay.kill().await?;
    let (librdkafka, started) = (librdkafka.expect("seen"), started.expect("seen"));
    assert_eq!(librdkafka.0, started.0, "librdkafka's lines are in the relay command's trace");

    // A command that fails reports its error as a JSON line too (exit 2 here:
    // the database has no Herald schema).
    let empty = format!("sqlite:{}?mode=rwc", tmp.path().join("empty.db").display());
    let failed = herald().args(["relay", "--log-format", "json", "--database", &empty, "--kafka", "127.0.0.1:1"]).output().await?;
    assert_eq!(failed.status.code(), Some(2), "{}", String::from_utf8_lossy(&failed.stderr));
    let stderr = String::from_utf8_lossy(&failed.stderr);
    let last: serde_json::Value =
        serde_json::from_str(stderr.lines().last().unwrap_or_default()).map_err(|e| anyhow::anyhow!("{e}: {stderr}"))?;
    assert_eq!((last["level"].as_str(), last["exit_code"].as_i64()), (Some("ERROR"), Some(2)), "{last}");
    assert!(last["error"].as_str().unwrap_or_default().contains("herald migrate"), "{last}");
    ids(&last);
    Ok(())
}
