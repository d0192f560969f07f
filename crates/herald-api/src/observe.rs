//! What operators look at: `GET /metrics` (Prometheus text), `GET /status`
//! (a self-contained dashboard page) and `GET /status.json` (the figures
//! and recent samples it plots). All three read the monitor's latest
//! refresh; none touches the database per request. They carry aggregate
//! figures only, no caller's data, and need no token (like `/healthz`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use axum::{Json, Router};
use herald_status::{DASHBOARD_HTML, Monitor};

pub fn routes(monitor: Arc<Monitor>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/status", get(|| async { Html(DASHBOARD_HTML) }))
        .route("/status.json", get(status_json))
        .with_state(monitor)
}

async fn metrics(State(monitor): State<Arc<Monitor>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], monitor.prometheus())
}

async fn status_json(State(monitor): State<Arc<Monitor>>) -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-store")], Json(monitor.json()))
}
