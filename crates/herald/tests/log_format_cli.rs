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
