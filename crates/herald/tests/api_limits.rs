//! The API's limits as a caller meets them: a caller over its rate and any
//! request over the concurrency limit get `429` with `Retry-After` and a
//! problem document, other callers are unaffected, and a body over the limit
//! is refused before it is buffered.

use std::num::NonZeroU32;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::routing::{get, post};
use herald_api::Tokens;
use herald_api::limits::{self, Limits};
use reqwest::StatusCode;
use tokio::sync::{Notify, mpsc};

async fn serve(app: Router) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(base)
}

fn tokens() -> anyhow::Result<Tokens> {
    Tokens::parse("alice-token:alice,bob-token:bob").map_err(anyhow::Error::msg)
}

fn limits(concurrency: usize, per_sec: u32, burst: u32) -> Limits {
    let n = |v: u32| NonZeroU32::new(v).unwrap_or(NonZeroU32::MIN);
    Limits { concurrency, per_caller_per_sec: n(per_sec), per_caller_burst: n(burst), ..Limits::default() }
}

async fn assert_limited(response: reqwest::Response) -> anyhow::Result<()> {
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!(retry_after >= 1, "Retry-After in whole seconds");
    assert_eq!(response.headers().get("content-type").and_then(|v| v.to_str().ok()), Some("application/problem+json"));
    let problem: serde_json::Value = response.json().await?;
    assert_eq!(problem["type"], "/problems/rate-limited", "{problem}");
    Ok(())
}

#[tokio::test]
async fn a_caller_over_its_rate_waits_and_others_do_not() -> anyhow::Result<()> {
    let app = limits::apply(Router::new().route("/ping", get(|| async { "pong" })), limits(100, 1, 2), tokens()?);
    let base = serve(app).await?;
    let http = reqwest::Client::new();
    let ping = |token: &'static str| http.get(format!("{base}/ping")).bearer_auth(token).send();
    assert_eq!(ping("alice-token").await?.status(), StatusCode::OK);
    assert_eq!(ping("alice-token").await?.status(), StatusCode::OK);
    assert_limited(ping("alice-token").await?).await?;
    assert_eq!(ping("bob-token").await?.status(), StatusCode::OK, "bob has a rate of his own");
    Ok(())
}

#[tokio::test]
async fn requests_over_the_concurrency_limit_are_refused_not_queued() -> anyhow::Result<()> {
    let (entered_tx, mut entered) = mpsc::channel::<()>(1);
    let release = Arc::new(Notify::new());
    let gate = release.clone();
    let slow = get(move || {
        let (entered_tx, gate) = (entered_tx.clone(), gate.clone());
        async move {
            let _ = entered_tx.send(()).await;
            gate.notified().await;
            "done"
        }
    });
    let app = limits::apply(Router::new().route("/slow", slow).route("/ping", get(|| async { "pong" })), limits(1, 1000, 1000), tokens()?);
    let base = serve(app).await?;
    let http = reqwest::Client::new();
    let first = tokio::spawn(http.get(format!("{base}/slow")).bearer_auth("alice-token").send());
    entered.recv().await;
    assert_limited(http.get(format!("{base}/ping")).bearer_auth("bob-token").send().await?).await?;
    release.notify_one();
    assert_eq!(first.await??.status(), StatusCode::OK);
    assert_eq!(http.get(format!("{base}/ping")).bearer_auth("bob-token").send().await?.status(), StatusCode::OK);
    Ok(())
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused() -> anyhow::Result<()> {
    let echo = post(|body: Bytes| async move { body.len().to_string() });
    let app = limits::apply(Router::new().route("/echo", echo), Limits::default(), tokens()?);
    let base = serve(app).await?;
    let http = reqwest::Client::new();
    let small = http.post(format!("{base}/echo")).bearer_auth("alice-token").body(vec![b'x'; 1000]).send().await?;
    assert_eq!(small.status(), StatusCode::OK);
    let large =
        http.post(format!("{base}/echo")).bearer_auth("alice-token").body(vec![b'x'; Limits::default().body_bytes + 1]).send().await?;
    assert_eq!(large.status(), StatusCode::PAYLOAD_TOO_LARGE);
    Ok(())
}

#[tokio::test]
async fn a_search_over_its_slots_waits_for_one_then_is_refused() -> anyhow::Result<()> {
    use axum::response::IntoResponse;
    use herald_api::limits::SearchSlots;

    let slots = SearchSlots::new(1);
    let held = slots.acquire().await.map_err(|p| anyhow::anyhow!("{p:?}"))?;
    let waiting = tokio::spawn({
        let slots = slots.clone();
        async move { slots.acquire().await.is_ok() }
    });
    drop(held);
    assert!(waiting.await?, "a freed slot goes to the search waiting for it");

    let _held = slots.acquire().await.map_err(|p| anyhow::anyhow!("{p:?}"))?;
    let refused = slots.acquire().await.expect_err("no slot frees up: refused after the wait").into_response();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    Ok(())
}
