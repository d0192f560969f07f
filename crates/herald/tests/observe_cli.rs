//! Where the deployment's internals are served: `/metrics` and
//! `/status.json` carry error texts of the database and the brokers, so on
//! the API's listener they need the observer's token (made and printed at
//! start unless given), or they move to a listener of their own.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Starts `herald api` on the embedded default with `extra` flags; returns
/// it and the lines it printed up to the dashboard's.
async fn api(extra: &[&str]) -> anyhow::Result<(Child, Vec<String>, herald_testkit::TestDb)> {
    let db = herald_testkit::sqlite_db()?;
    // Roles check the schema and leave migrating to `herald migrate`.
    herald_store::Db::connect_and_migrate(&db.url).await?.close().await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["api", "--listen", "127.0.0.1:0", "--database", &db.url, "--tokens", "alice-token:alice"])
        .args(extra)
        .env_remove("HERALD_KAFKA_BROKERS")
        .env_remove("HERALD_OBSERVE_TOKEN")
        .env_remove("HERALD_OBSERVE_LISTEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?).lines();
    let mut printed = Vec::new();
    let read = async {
        while let Some(line) = lines.next_line().await? {
            let done = line.starts_with("dashboard");
            printed.push(line);
            if done {
                break;
            }
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(120), read).await??;
    Ok((child, printed, db))
}

fn after<'a>(line: &'a str, marker: &str) -> &'a str {
    line.split_once(marker).map_or("", |(_, rest)| rest.split([' ', ',', '/']).next().unwrap_or(""))
}

async fn status(url: &str, token: Option<&str>) -> anyhow::Result<u16> {
    let mut request = reqwest::Client::new().get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    Ok(request.send().await?.status().as_u16())
}

#[tokio::test(flavor = "multi_thread")]
async fn on_the_api_listener_the_figures_need_the_printed_token() -> anyhow::Result<()> {
    let (_api, printed, _db) = api(&[]).await?;
    let base = format!("http://{}", after(&printed[0], "http://"));
    let dashboard = printed.last().cloned().unwrap_or_default();
    let token = after(&dashboard, "#token=").to_owned();
    assert!(token.starts_with("observe-"), "printed with the dashboard: {dashboard}");
    for page in ["/metrics", "/status.json"] {
        assert_eq!(status(&format!("{base}{page}"), None).await?, 401, "{page} without a token");
        assert_eq!(status(&format!("{base}{page}"), Some("alice-token")).await?, 401, "{page}: a caller's token is not the observer's");
        assert_eq!(status(&format!("{base}{page}"), Some(&token)).await?, 200, "{page} with the observer's token");
    }
    assert_eq!(status(&format!("{base}/status"), None).await?, 200, "the page itself holds no figures");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_given_token_is_required_and_never_printed() -> anyhow::Result<()> {
    let (_api, printed, _db) = api(&["--observe-token", "given-observer-token"]).await?;
    assert!(printed.iter().all(|l| !l.contains("given-observer-token")), "{printed:#?}");
    let base = format!("http://{}", after(&printed[0], "http://"));
    assert_eq!(status(&format!("{base}/metrics"), None).await?, 401);
    assert_eq!(status(&format!("{base}/metrics"), Some("given-observer-token")).await?, 200);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listener_of_their_own_takes_them_off_the_api() -> anyhow::Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let (_api, printed, _db) = api(&["--observe-listen", &format!("127.0.0.1:{port}")]).await?;
    let base = format!("http://{}", after(&printed[0], "http://"));
    let observer = format!("http://127.0.0.1:{port}");
    for page in ["/metrics", "/status.json", "/status"] {
        assert_eq!(status(&format!("{observer}{page}"), None).await?, 200, "{page} on its own listener");
        assert_eq!(status(&format!("{base}{page}"), Some("alice-token")).await?, 404, "{page} is not on the API's");
    }
    Ok(())
}
