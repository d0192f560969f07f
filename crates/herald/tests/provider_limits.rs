//! A provider is another party: its answers are read up to a cap. A 2xx
//! whose body does not fit is no receipt (the outcome stays `unknown`), an
//! error's oversized body is cut, and neither exhausts the dispatcher.

use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use herald_notify::provider::{KeyStatus, MAX_BODY_BYTES, ProviderClient, SendOutcome};

/// A provider answering every call with `status` and a body of `len` bytes.
async fn provider(status: StatusCode, len: usize) -> anyhow::Result<String> {
    let body = format!("{{\"receipt\":\"{}\"}}", "r".repeat(len));
    let (send_body, get_body) = (body.clone(), body);
    let app = Router::new()
        .route("/v1/notifications", post(move || async move { (status, send_body) }))
        .route("/v1/notifications/{key}", get(move || async move { (status, get_body) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

#[tokio::test]
async fn a_receipt_too_large_to_read_is_no_evidence() -> anyhow::Result<()> {
    let url = provider(StatusCode::OK, 16 * MAX_BODY_BYTES).await?;
    let client = ProviderClient::new(&url, Duration::from_secs(10))?;
    match client.send("k", "{}", None).await {
        SendOutcome::Unknown { reason } => assert!(reason.contains("not read"), "{reason}"),
        other => panic!("an unreadable 2xx is unknown, got {other:?}"),
    }
    let status = client.status("k").await;
    assert!(status.as_ref().is_err_and(|e| e.contains("not read")), "{status:?}");
    Ok(())
}

#[tokio::test]
async fn an_errors_huge_body_is_cut() -> anyhow::Result<()> {
    let url = provider(StatusCode::BAD_REQUEST, 16 * MAX_BODY_BYTES).await?;
    let client = ProviderClient::new(&url, Duration::from_secs(10))?;
    match client.send("k", "{}", None).await {
        SendOutcome::Answered { status, detail, .. } => {
            assert_eq!(status, 400);
            assert!(detail.len() <= MAX_BODY_BYTES, "detail of {} bytes", detail.len());
        }
        other => panic!("a 400 is an answer, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn a_small_receipt_is_read_whole() -> anyhow::Result<()> {
    let url = provider(StatusCode::OK, 100).await?;
    let client = ProviderClient::new(&url, Duration::from_secs(10))?;
    assert!(matches!(client.send("k", "{}", None).await, SendOutcome::Accepted { receipt } if receipt.len() == 100));
    assert!(matches!(client.status("k").await, Ok(KeyStatus::Accepted { .. })));
    Ok(())
}
