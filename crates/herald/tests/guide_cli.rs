//! docs/use-herald-with-your-service.md, run as written: every `sh`, `sql`
//! and `python` block in order, as one shell session (SQL through psql,
//! Python through python3), on PostgreSQL and the shared Apache Kafka
//! cluster, with `herald` and the example's `order-totals` on the PATH.
//! Only the topic names are made unique, so runs on one cluster do not
//! meet. A block that fails fails the test with the session's output.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use herald_testkit::unique;

/// One bash script running `blocks`; background jobs die with it.
fn session(blocks: &[(String, String)]) -> String {
    let mut script = String::from("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n");
    for (lang, body) in blocks {
        match lang.as_str() {
            "sh" => script.push_str(body),
            "sql" => script.push_str(&format!("psql -v ON_ERROR_STOP=1 -q \"$HERALD_DATABASE_URL\" <<'HERALD_SQL'\n{body}\nHERALD_SQL")),
            _ => script.push_str(&format!("python3 - <<'HERALD_PY'\n{body}\nHERALD_PY")),
        }
        script.push('\n');
    }
    script
}

#[tokio::test(flavor = "multi_thread")]
async fn the_guide_runs_as_written_postgres() -> anyhow::Result<()> {
    // The runnable blocks; the others (TOML, Rust) are read, not run.
    let blocks: Vec<(String, String)> = herald_testkit::docs::blocks("docs/use-herald-with-your-service.md")?
        .into_iter()
        .filter(|(lang, _)| ["sh", "sql", "python"].contains(&lang.as_str()))
        .collect();
    let langs: Vec<&str> = blocks.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(langs, ["sh", "sql", "python", "sh", "sh", "sh"], "the guide's blocks changed: update this test's expectations");

    let bin = Path::new(env!("CARGO_BIN_EXE_herald")).parent().expect("a directory").to_owned();
    anyhow::ensure!(
        bin.join("order-totals").exists(),
        "{} has no order-totals binary: `cargo build -p order-totals` (scripts/test builds the workspace)",
        bin.display()
    );
    let test_db = herald_testkit::postgres_db().await?;
    let brokers = herald_testkit::real_broker()?;
    let prefix = unique("guide");
    let script = session(&blocks).replace("shop.orders", &format!("{prefix}.orders")).replace("shop.other", &format!("{prefix}.other"));

    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut child = tokio::process::Command::new("bash")
        .args(["-c", &script])
        .env("PATH", path)
        .env("HERALD_DATABASE_URL", &test_db.url)
        .env("HERALD_KAFKA_BROKERS", &brokers)
        .env("HERALD_LOG", "warn")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a session that hangs can be killed with
        // its background jobs (the trap only runs when bash exits).
        .process_group(0)
        .kill_on_drop(true)
        .spawn()?;
    // Collected as it comes: the background jobs hold the pipes open, so a
    // hung session's output would otherwise be lost with it.
    let ((stdout, stdout_read), (stderr, stderr_read)) = (collect(child.stdout.take()), collect(child.stderr.take()));
    let status = match tokio::time::timeout(Duration::from_secs(240), child.wait()).await {
        Ok(status) => status?,
        Err(_) => {
            if let Some(pid) = child.id() {
                let _ = std::process::Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
            }
            anyhow::bail!("the guide's session did not finish in 240 s; so far:\n{}\n{}", text(&stdout), text(&stderr));
        }
    };
    // bash is gone and its trap killed the jobs: the pipes end.
    let _ = tokio::time::timeout(Duration::from_secs(30), futures::future::join(stdout_read, stderr_read)).await;
    let (stdout, stderr) = (text(&stdout), text(&stderr));
    assert!(status.success(), "the guide failed ({status}):\n{stdout}\n{stderr}");
    assert_eq!(stdout.matches("alice: 2 orders, 5000 cents").count(), 2, "before and after the rebuild:\n{stdout}\n{stderr}");
    assert!(stdout.contains("generation 2 active"), "{stdout}\n{stderr}");
    Ok(())
}

type Collected = std::sync::Arc<std::sync::Mutex<Vec<u8>>>;

/// Reads `pipe` in the background, to its end, into a buffer that can be
/// looked at any time.
fn collect(pipe: Option<impl tokio::io::AsyncRead + Unpin + Send + 'static>) -> (Collected, tokio::task::JoinHandle<()>) {
    let buffer = Collected::default();
    let reader = tokio::spawn({
        let buffer = buffer.clone();
        async move {
            let Some(mut pipe) = pipe else { return };
            let mut chunk = [0u8; 4096];
            while let Ok(n @ 1..) = tokio::io::AsyncReadExt::read(&mut pipe, &mut chunk).await {
                buffer.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend_from_slice(&chunk[..n]);
            }
        }
    });
    (buffer, reader)
}

fn text(collected: &Collected) -> String {
    String::from_utf8_lossy(&collected.lock().unwrap_or_else(std::sync::PoisonError::into_inner)).into_owned()
}
