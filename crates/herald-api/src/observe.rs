//! What operators look at: `GET /metrics` (Prometheus text), `GET /status`
//! (a self-contained dashboard page) and `GET /status.json` (the figures
//! and recent samples it plots). All three read the monitor's latest
//! refresh; none touches the database per request. They carry no caller's
//! data, but they do carry the deployment's internals (error texts of the
//! database and the brokers, topic names, relay owners): served either on a
//! listener of their own (`--observe-listen`, for the network to guard) or,
//! on the API's listener, only to the observer's bearer token. The
//! dashboard page holds no figures and stays open; it sends the token it
//! finds in its URL's fragment (`/status#token=…`, never sent to a server).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use herald_secret::Secret;
use herald_status::{DASHBOARD_HTML, Monitor};
use utoipa::ToSchema;

use crate::problem::Problem;

/// Who may read the figures.
#[derive(Debug, Clone)]
pub enum Access {
    /// Anyone who reaches the listener (a listener of their own, or tests).
    Open,
    /// Requests with `Authorization: Bearer <token>`.
    Bearer(Secret),
}

pub fn routes(monitor: Arc<Monitor>, access: Access) -> Router {
    let figures = Router::new()
        .route("/metrics", get(metrics))
        .route("/status.json", get(status_json))
        .method_not_allowed_fallback(|| async { Problem::method_not_allowed() })
        .with_state(monitor);
    let figures = match access {
        Access::Open => figures,
        Access::Bearer(token) => figures.layer(middleware::from_fn_with_state(Arc::new(token), require_token)),
    };
    figures.route("/status", get(dashboard))
}

async fn require_token(State(token): State<Arc<Secret>>, request: Request, next: Next) -> Response {
    if bearer(request.headers()) == Some(token.expose()) {
        next.run(request).await
    } else {
        Problem::unauthorized("the figures need the observer's token: Authorization: Bearer <token>").into_response()
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION)?.to_str().ok()?.strip_prefix("Bearer ").map(str::trim)
}

/// The latest figures in the Prometheus text exposition format.
#[utoipa::path(get, path = "/metrics", tag = "operations", security(("bearer" = [])),
    responses(
        (status = 200, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain"),
        (status = 401, description = "On the API's listener: no or another token than the observer's", body = Problem, content_type = "application/problem+json"),
    ))]
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
#[utoipa::path(get, path = "/status.json", tag = "operations", security(("bearer" = [])),
    responses(
        (status = 200, description = "The monitor's latest refresh", body = StatusDocument),
        (status = 401, description = "On the API's listener: no or another token than the observer's", body = Problem, content_type = "application/problem+json"),
    ))]
async fn status_json(State(monitor): State<Arc<Monitor>>) -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-store")], Json(monitor.json()))
}
