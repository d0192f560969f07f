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
use utoipa::ToSchema;

use crate::problem::Problem;

pub fn routes(monitor: Arc<Monitor>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/status", get(dashboard))
        .route("/status.json", get(status_json))
        .method_not_allowed_fallback(|| async { Problem::method_not_allowed() })
        .with_state(monitor)
}

/// The latest figures in the Prometheus text exposition format.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain")))]
async fn metrics(State(monitor): State<Arc<Monitor>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], monitor.prometheus())
}

/// A self-contained page that plots `/status.json`.
#[utoipa::path(get, path = "/status", tag = "operations",
    responses((status = 200, description = "The dashboard", body = String, content_type = "text/html")))]
async fn dashboard() -> Html<&'static str> {
    Html(DASHBOARD_HTML)
}

/// The shape of `Monitor::json`, which builds it with `json!`.
#[derive(ToSchema)]
#[allow(dead_code)] // Only its schema is used.
pub(crate) struct StatusDocument {
    /// The latest figures (`herald status --json`'s), null before the first refresh.
    #[schema(value_type = Option<Object>)]
    status: Option<serde_json::Value>,
    /// Recent samples, oldest first.
    #[schema(value_type = Vec<Object>)]
    history: Vec<serde_json::Value>,
    /// Why the latest refresh failed, if it did.
    error: Option<String>,
    /// Milliseconds between refreshes.
    interval_ms: u64,
}

/// The figures and recent samples the dashboard plots.
#[utoipa::path(get, path = "/status.json", tag = "operations",
    responses((status = 200, description = "The monitor's latest refresh", body = StatusDocument)))]
async fn status_json(State(monitor): State<Arc<Monitor>>) -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-store")], Json(monitor.json()))
}
