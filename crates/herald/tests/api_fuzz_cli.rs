//! `herald serve` on the embedded default (SQLite, in-process Kafka), fuzzed
//! over loopback by schemathesis from the server's own `/openapi.json`: no
//! 5xx, and every response's status, content type, headers and body are the
//! ones the document gives for that operation; requests without the token,
//! without a required header, with an undocumented method or with data the
//! schema forbids are refused. The seed is fixed (`HERALD_FUZZ_SEED` picks
//! another) and printed with the command line, so a failure replays.
//!
//! schemathesis comes from PyPI; scripts/test installs it. Missing, the test
//! fails rather than skips: a fuzz test that silently did not run proves
//! nothing.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::process::{Child, Command};

const TOKEN: &str = "fuzz-token";
/// Fixed so that a failure is the same failure when run again.
const SEED: &str = "18";
/// Per operation and phase: enough to reach the odd inputs, few enough for
/// a minute or two on two cores.
const MAX_EXAMPLES: &str = "50";
/// A request that takes longer is a hang, not a slow answer.
const REQUEST_TIMEOUT_SECS: &str = "20";
/// The whole run, server start included.
const RUN_BOUND: Duration = Duration::from_secs(10 * 60);
const START_BOUND: Duration = Duration::from_secs(120);

/// What schemathesis is told besides its flags.
///
/// `positive_data_acceptance` takes a status outside its default list for
/// valid input as a rejection of that input. 410 is not one: a GET of an
/// export its owner deleted answers 410 Gone by design (documented, and the
/// stateful phase does POST, DELETE, GET). The list is schemathesis' default
/// plus 410, nothing removed.
///
/// Random ids only ever reach "not found": half of the reads of an export
/// take the id of one that finished, so the result route answers its CSV and
/// its JSON and both are checked against the document.
fn config(finished: &[String]) -> String {
    format!(
        r#"[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "410", "429", "5xx"]

[dictionaries.finished]
values = {ids}

[[operations]]
include-method = "GET"
include-path-regex = "^/v1/exports/"
parameters = {{ "path.id" = {{ dictionary = "finished", probability = 0.5 }} }}
"#,
        ids = json!(finished)
    )
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The version schemathesis reports, or a failure that says how to get it.
async fn schemathesis_version() -> String {
    match Command::new("schemathesis").arg("--version").output().await {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        Ok(out) => panic!("`schemathesis --version` failed: {}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => panic!(
            "schemathesis is not installed ({e}): scripts/test installs it, or run `python3 -m pip install schemathesis` \
             (the HTTP API fuzz test needs it and does not skip)"
        ),
    }
}

/// `herald serve` with nothing of the caller's environment that could point
/// it elsewhere (a database, a broker, injected faults): the embedded default.
fn serve(port: u16, dir: &Path) -> anyhow::Result<Child> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_herald"));
    command
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--tokens", &format!("{TOKEN}:fuzzer")])
        // One header for the export routes and the figures alike.
        .args(["--observe-token", TOKEN])
        .env("HERALD_LOG", "warn")
        // Its data directory (SQLite, artifacts) goes with ours.
        .env("TMPDIR", dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("serve.out"))?)
        .stderr(std::fs::File::create(dir.join("serve.err"))?)
        .kill_on_drop(true);
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("HERALD_") && name != "HERALD_LOG") {
        command.env_remove(name);
    }
    Ok(command.spawn()?)
}

/// Polls `ready` until it holds, the server exits or `START_BOUND` passes.
async fn wait_for<F, Fut>(what: &str, server: &mut Child, dir: &Path, mut ready: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + START_BOUND;
    loop {
        if let Some(status) = server.try_wait()? {
            anyhow::bail!("herald serve exited with {status}, waiting for {what}: {}", server_log(dir));
        }
        if ready().await {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "no {what} within {START_BOUND:?}: {}", server_log(dir));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One finished export in each format, for the fuzzer's reads.
async fn finished_exports(base: &str, server: &mut Child, dir: &Path) -> anyhow::Result<Vec<String>> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let mut ids = Vec::new();
    for format in ["csv", "json"] {
        let created: Value = http
            .post(format!("{base}/v1/exports"))
            .bearer_auth(TOKEN)
            .header("Idempotency-Key", format!("seed-{format}"))
            .json(&json!({"format": format, "query": format!("seeded {format}")}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        ids.push(created["job_id"].as_str().unwrap_or_default().to_owned());
    }
    for id in &ids {
        let (http, url) = (&http, &format!("{base}/v1/exports/{id}"));
        wait_for(&format!("export {id} to succeed"), server, dir, || async move {
            let job = async { http.get(url).bearer_auth(TOKEN).send().await?.json::<Value>().await };
            job.await.is_ok_and(|job| job["status"] == "succeeded")
        })
        .await?;
    }
    Ok(ids)
}

fn server_log(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join("serve.err")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(60).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// Asks the server to stop as an operator would, so it drains and removes
/// its data directory; killed if it does not within the bound.
async fn stop(mut server: Child) -> anyhow::Result<()> {
    if let Some(pid) = server.id() {
        Command::new("kill").args(["-TERM", &pid.to_string()]).status().await?;
    }
    if tokio::time::timeout(Duration::from_secs(30), server.wait()).await.is_err() {
        server.kill().await?;
    }
    Ok(())
}

/// Per operation (`GET /v1/exports/{id}`), the statuses and content types
/// the recorded requests got.
fn exercised(har: &Value) -> BTreeMap<String, Vec<(u64, String)>> {
    let mut seen: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
    for entry in har["log"]["entries"].as_array().into_iter().flatten() {
        let url = entry["request"]["url"].as_str().unwrap_or_default();
        let path = url.split("://").nth(1).and_then(|rest| rest.find('/').map(|i| &rest[i..])).unwrap_or_default();
        let path = path.split('?').next().unwrap_or_default();
        let segments: Vec<&str> = path.split('/').collect();
        let template = match segments.as_slice() {
            ["", "v1", "exports", _] => "/v1/exports/{id}".to_owned(),
            ["", "v1", "exports", _, "result"] => "/v1/exports/{id}/result".to_owned(),
            _ => path.to_owned(),
        };
        let method = entry["request"]["method"].as_str().unwrap_or_default();
        let response = &entry["response"];
        let content_type = response["headers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|h| h["name"].as_str().is_some_and(|n| n.eq_ignore_ascii_case("content-type")))
            .and_then(|h| h["value"].as_str())
            .unwrap_or_default();
        let status = response["status"].as_u64().unwrap_or_default();
        seen.entry(format!("{method} {template}")).or_default().push((status, content_type.to_owned()));
    }
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn schemathesis_finds_nothing_on_the_documented_api() -> anyhow::Result<()> {
    let started = Instant::now();
    let version = schemathesis_version().await;
    let dir = tempfile::Builder::new().prefix("herald-fuzz-").tempdir()?;
    let port = free_port()?;
    let base = format!("http://127.0.0.1:{port}");
    let mut server = serve(port, dir.path())?;
    let (http, health) = (&reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?, &format!("{base}/healthz"));
    wait_for("an answer on /healthz", &mut server, dir.path(), || async move {
        http.get(health).send().await.is_ok_and(|r| r.status().is_success())
    })
    .await?;
    let finished = finished_exports(&base, &mut server, dir.path()).await?;
    let config_file = dir.path().join("schemathesis.toml");
    std::fs::write(&config_file, config(&finished))?;
    let har_file = dir.path().join("requests.har");

    let seed = std::env::var("HERALD_FUZZ_SEED").unwrap_or_else(|_| SEED.to_owned());
    let args = [
        "--config-file",
        &config_file.display().to_string(),
        "--no-color",
        "run",
        &format!("{base}/openapi.json"),
        "--header",
        &format!("Authorization: Bearer {TOKEN}"),
        // Every check schemathesis has: `not_a_server_error`, the status
        // code, content type, header and body conformance, and the probes
        // (no token, missing header, undocumented method, data the schema
        // forbids, use after delete).
        "--checks",
        "all",
        "--max-examples",
        MAX_EXAMPLES,
        "--seed",
        &seed,
        "--request-timeout",
        REQUEST_TIMEOUT_SECS,
        // One worker: the same seed, the same requests in the same order.
        "--workers",
        "1",
        // Nothing learnt by an earlier run changes this one, nor is it kept.
        "--generation-database",
        "none",
        "--report",
        "har",
        "--report-har-path",
        &har_file.display().to_string(),
    ];
    println!("{version}, seed {seed}; replay: schemathesis {}\nwith {}:\n{}", args.join(" "), config_file.display(), config(&finished));
    let fuzz = Command::new("schemathesis").args(args).current_dir(dir.path()).stdin(Stdio::null()).kill_on_drop(true).output();
    let out = tokio::time::timeout(RUN_BOUND.saturating_sub(started.elapsed()), fuzz)
        .await
        .map_err(|_| anyhow::anyhow!("schemathesis ran longer than {RUN_BOUND:?}"))??;
    stop(server).await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let log = server_log(dir.path());
    assert!(out.status.success(), "schemathesis (seed {seed}) failed:\n{stdout}\n{stderr}\nherald serve's log:\n{log}");
    assert!(!log.contains("panicked"), "herald serve panicked:\n{log}");

    // A run that reached nothing would pass too: every operation must have
    // answered a success, the result route in both formats.
    let har: Value = serde_json::from_slice(&std::fs::read(&har_file)?)?;
    let seen = exercised(&har);
    let operations = [
        "GET /healthz",
        "GET /metrics",
        "GET /status",
        "GET /status.json",
        "GET /openapi.json",
        "POST /v1/exports",
        "GET /v1/exports/{id}",
        "DELETE /v1/exports/{id}",
        "GET /v1/exports/{id}/result",
        "GET /v1/search",
    ];
    for operation in operations {
        let answers = seen.get(operation).map(Vec::as_slice).unwrap_or_default();
        assert!(answers.iter().any(|(status, _)| (200..300).contains(status)), "{operation} never succeeded: {answers:?}\n{stdout}");
    }
    let results = &seen["GET /v1/exports/{id}/result"];
    for media in ["text/csv", "application/json"] {
        assert!(results.iter().any(|(status, ct)| *status == 200 && ct.starts_with(media)), "no {media} result: {results:?}");
    }
    let requests: usize = seen.values().map(Vec::len).sum();
    println!("{stdout}\n{requests} requests, fuzzed in {:?}", started.elapsed());
    Ok(())
}
