//! `GET /status`, `GET /status.json` and `GET /metrics` of a running stack,
//! after exports were driven through HTTP (with a repeat and a conflict):
//! the JSON and the Prometheus text carry the expected figures, and the
//! dashboard page, loaded in headless Chromium, renders them and plots
//! points. A page whose script fails leaves no figures in the DOM, which
//! fails the test.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use common::{ALICE, Broker, Database, Stack, export_body};
use serde_json::Value;

const EXPORTS: usize = 5;

/// Headless Chromium: `HERALD_CHROMIUM`, or `chromium` on the PATH (the
/// Debian package scripts/test installs). Missing is a failure, not a skip.
fn chromium() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("HERALD_CHROMIUM").filter(|p| !p.is_empty()) {
        return Ok(path.into());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    ["chromium", "chromium-browser"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
        .context("headless Chromium not found: install the Debian package `chromium` (scripts/test installs it) or set HERALD_CHROMIUM")
}

/// The page's DOM after its scripts ran for `budget` of virtual time (its
/// timers fire; network answers are awaited).
async fn dump_dom(chromium: &PathBuf, url: &str, budget: Duration) -> anyhow::Result<String> {
    let profile = tempfile::tempdir()?;
    let run = tokio::process::Command::new(chromium)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run"])
        .args(["--disable-background-networking", "--disable-component-update", "--disable-sync"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={}", budget.as_millis()))
        .args(["--dump-dom", url])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run).await.context("chromium did not finish in 120 s")??;
    anyhow::ensure!(out.status.success(), "chromium failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8(out.stdout)?)
}

/// Text of the element marked `data-figure="<key>"`.
fn figure<'a>(dom: &'a str, key: &str) -> Option<&'a str> {
    let at = dom.find(&format!("data-figure=\"{key}\""))?;
    let text = &dom[at..][dom[at..].find('>')? + 1..];
    Some(&text[..text.find('<')?])
}

/// The opening tag of the element with `id`, and everything up to its end tag.
fn element<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let rest = &dom[at..];
    Some(&rest[..rest.find("</svg>")?])
}

fn attribute(tag: &str, name: &str) -> Option<i64> {
    let at = tag.find(&format!("{name}=\""))? + name.len() + 2;
    tag[at..tag[at..].find('"')? + at].parse().ok()
}

/// Polls `/status.json` until `ready` holds.
async fn status_until(stack: &Stack, ready: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let answer: Value = stack.http.get(format!("{}/status.json", stack.base)).send().await?.json().await?;
        if ready(&answer) {
            return Ok(answer);
        }
        anyhow::ensure!(Instant::now() < deadline, "status never got there: {answer}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn dashboard_shows_the_figures(database: Database, broker: Broker) -> anyhow::Result<()> {
    let chromium = chromium()?;
    let stack = common::start(database, broker).await?;
    for i in 0..EXPORTS {
        let (status, _, answer) = stack.post_export(ALICE, Some(&format!("k{i}")), &export_body("csv", &format!("dash{i}"))).await?;
        assert_eq!(status, 202, "{answer}");
    }
    // A repeat is the same job; a conflict writes nothing: still EXPORTS jobs.
    let (repeat, _, _) = stack.post_export(ALICE, Some("k0"), &export_body("csv", "dash0")).await?;
    let (conflict, _, _) = stack.post_export(ALICE, Some("k0"), &export_body("json", "dash0")).await?;
    assert!(matches!(repeat, 200 | 202) && conflict == 409, "{repeat} {conflict}");

    let done = status_until(&stack, |v| {
        let s = &v["status"];
        let subs = s["subscriptions"].as_array().cloned().unwrap_or_default();
        s["jobs"]["by_status"]["succeeded"] == EXPORTS
            && subs.len() == 3
            && subs.iter().all(|x| x["inbox_rows"] == EXPORTS && x["lag"] == 0)
            && s["outbox"]["backlog"] == 0
            && v["history"].as_array().is_some_and(|h| h.len() >= 3)
    })
    .await?;
    let s = &done["status"];
    assert_eq!(s["jobs"]["open"], 0);
    assert_eq!(s["jobs"]["latency"]["samples"], EXPORTS);
    assert!(s["jobs"]["latency"]["p50_ms"].as_i64().is_some_and(|ms| ms > 0), "{s}");
    assert_eq!(s["generations"][0]["active"], true);
    assert_eq!(s["generations"][0]["documents"], EXPORTS);
    assert_eq!(s["kafka"]["end_offsets"][&stack.wiring.topics.events], EXPORTS, "one completion event per job");
    let pending_intents = stack.count("SELECT COUNT(*) AS n FROM notification_intents WHERE status = 'pending'").await?;
    assert!(pending_intents > 0, "the notify subscription made intents (no dispatcher runs here)");

    // The same figures as Prometheus text, plus the runtime's counters.
    let metrics = stack.http.get(format!("{}/metrics", stack.base)).send().await?.text().await?;
    for line in [
        format!("herald_export_jobs{{status=\"succeeded\"}} {EXPORTS}"),
        "herald_outbox_backlog 0".to_owned(),
        "herald_subscription_lag{subscription=\"search\"} 0".to_owned(),
        format!("herald_subscription_inbox_rows{{subscription=\"notify\"}} {EXPORTS}"),
        format!("herald_notification_intents{{status=\"pending\"}} {pending_intents}"),
        format!("herald_consumer_events_applied_total{{subscription=\"stats\"}} {EXPORTS}"),
        format!("herald_export_latency_seconds_count {EXPORTS}"),
        "herald_kafka_up 1".to_owned(),
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing `{line}` in /metrics:\n{metrics}");
    }
    let delivered =
        metrics.lines().find_map(|l| l.strip_prefix("herald_relay_rows_delivered_total ")).and_then(|n| n.parse::<usize>().ok());
    assert!(delivered.is_some_and(|n| n >= 2 * EXPORTS), "a command and a completion per job: {delivered:?}");

    // The page, as a browser shows it.
    let dom = dump_dom(&chromium, &format!("{}/status", stack.base), Duration::from_secs(5)).await?;
    assert!(dom.contains("data-state=\"ok\""), "the page's script did not finish a refresh:\n{dom}");
    let refreshes = dom.find("data-refreshes=\"").map(|at| attribute(&dom[at..], "data-refreshes"));
    assert!(refreshes.flatten().is_some_and(|n| n >= 2), "the page refreshes itself: {refreshes:?}");
    let expected = [
        ("jobs.succeeded", EXPORTS.to_string()),
        ("jobs.open", "0".to_owned()),
        ("outbox.backlog", "0".to_owned()),
        ("sub.search.inbox", EXPORTS.to_string()),
        ("sub.stats.inbox", EXPORTS.to_string()),
        ("sub.notify.lag", "0".to_owned()),
        ("intents.pending", pending_intents.to_string()),
        ("gen.search.1.documents", EXPORTS.to_string()),
        ("gen.search.1.state", "active".to_owned()),
    ];
    for (key, want) in expected {
        assert_eq!(figure(&dom, key), Some(want.as_str()), "figure {key} on the page");
    }
    assert!(figure(&dom, "latency.p50").is_some_and(|t| t != "-"), "a latency is shown");
    let outbox_plot = element(&dom, "plot-outbox").context("outbox plot")?;
    assert!(attribute(outbox_plot, "data-points").is_some_and(|n| n >= 3), "outbox age plotted: {outbox_plot}");
    let lag_plot = element(&dom, "plot-lag").context("lag plot")?;
    let lines: Vec<Option<i64>> = lag_plot.match_indices("<polyline").map(|(at, _)| attribute(&lag_plot[at..], "data-points")).collect();
    assert!(lines.len() == 3 && lines.iter().all(|n| n.is_some_and(|n| n >= 3)), "a lag line per subscription: {lag_plot}");
    let rate_plot = element(&dom, "plot-rate").context("rate plot")?;
    assert!(attribute(rate_plot, "data-points").is_some_and(|n| n >= 2), "events/s plotted: {rate_plot}");
    stack.stop().await
}

#[tokio::test(flavor = "multi_thread")]
async fn dashboard_on_postgres_and_the_real_broker() -> anyhow::Result<()> {
    dashboard_shows_the_figures(Database::Postgres, Broker::Real).await
}

#[tokio::test(flavor = "multi_thread")]
async fn dashboard_on_sqlite_and_the_mock_cluster() -> anyhow::Result<()> {
    dashboard_shows_the_figures(Database::Sqlite, Broker::Mock).await
}
