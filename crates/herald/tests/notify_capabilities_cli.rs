//! What Herald assumes about the provider, as a user starting it sees: a
//! provider nobody described is taken to be the cautious kind (no keys, not
//! queryable, 5xx not safe) and the startup line says so; `serve`'s embedded
//! simulator declares itself keyed and queryable; a lease a call could
//! outlive is refused as bad input.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const LINE: &str = "provider capabilities assumed";

fn herald(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.args(args).env("NO_COLOR", "1").env("HERALD_LOG", "info").kill_on_drop(true);
    for var in [
        "HERALD_DATABASE_URL",
        "HERALD_KAFKA_BROKERS",
        "HERALD_NOTIFY_URL",
        "HERALD_NOTIFY_IDEMPOTENT",
        "HERALD_NOTIFY_QUERYABLE",
        "HERALD_NOTIFY_5XX_SAFE",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// Escape sequences removed, in case the log is coloured anyway.
fn plain(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| c.is_ascii_alphabetic());
        } else {
            out.push(c);
        }
    }
    out
}

/// Starts `herald args…` and returns its startup capability line.
async fn assumed(args: &[&str]) -> anyhow::Result<String> {
    let mut child = herald(args).stderr(Stdio::piped()).stdout(Stdio::null()).spawn()?;
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let found = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            let line = plain(&line);
            if line.contains(LINE) {
                return anyhow::Ok(line);
            }
        }
        anyhow::bail!("exited without saying which capabilities it assumes")
    })
    .await?;
    child.start_kill()?;
    child.wait().await?;
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn an_undescribed_provider_is_assumed_cautious_and_the_startup_line_says_so() -> anyhow::Result<()> {
    let db = herald_testkit::sqlite_db()?;
    // Roles check the schema and leave migrating to `herald migrate`.
    herald_store::Db::connect_and_migrate(&db.url).await?.close().await;
    let line = assumed(&["dispatch", "--database", &db.url, "--notify-url", "http://127.0.0.1:9"]).await?;
    for field in ["honours_keys=false", "queryable=false", "server_errors_safe=false"] {
        assert!(line.contains(field), "{field} missing: {line}");
    }
    let declared = [
        "dispatch",
        "--database",
        &db.url,
        "--notify-url",
        "http://127.0.0.1:9",
        "--notify-idempotent",
        "true",
        "--notify-queryable",
        "true",
    ];
    let line = assumed(&declared).await?;
    assert!(line.contains("honours_keys=true") && line.contains("queryable=true"), "{line}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_declares_its_embedded_simulator_keyed_and_queryable() -> anyhow::Result<()> {
    let line = assumed(&["serve", "--listen", "127.0.0.1:0"]).await?;
    for field in ["honours_keys=true", "queryable=true", "server_errors_safe=false"] {
        assert!(line.contains(field), "{field} missing: {line}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lease_a_call_could_outlive_is_bad_input() -> anyhow::Result<()> {
    let db = herald_testkit::sqlite_db()?;
    // Roles check the schema and leave migrating to `herald migrate`.
    herald_store::Db::connect_and_migrate(&db.url).await?.close().await;
    let args = ["dispatch", "--database", &db.url, "--notify-url", "http://127.0.0.1:9", "--notify-lease", "1s", "--notify-timeout", "1s"];
    let out = herald(&args).output().await?;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--notify-lease"), "{}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}
