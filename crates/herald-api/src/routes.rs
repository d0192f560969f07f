use std::net::SocketAddr;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use herald_export::artifact::ArtifactStore;
use herald_export::deletion::{self, Deletion};
use herald_export::{ExportRequest, IntakeConfig, Job, jobs};
use herald_projections::search;
use herald_store::Db;
use serde::Deserialize;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::Tokens;
use crate::problem::Problem;

/// Longest accepted `Idempotency-Key`.
const MAX_KEY_LEN: usize = 255;
/// Most hits one search returns.
const SEARCH_LIMIT: i64 = 100;
/// Longest search text: longer ones are no real query, only work.
pub const MAX_SEARCH_CHARS: usize = 1024;

#[derive(Clone)]
pub struct AppState {
    pub db: Db,
    pub intake: IntakeConfig,
    pub artifacts: ArtifactStore,
    pub tokens: Tokens,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/v1/exports", post(create_export))
        .route("/v1/exports/{id}", get(get_export).delete(delete_export))
        .route("/v1/exports/{id}/result", get(get_result))
        .route("/v1/search", get(search_exports))
        .with_state(state)
}

/// Serves `router(state)` on `listener` until `shutdown`, finishing requests
/// in flight.
pub async fn serve(listener: TcpListener, state: AppState, shutdown: CancellationToken) -> std::io::Result<()> {
    serve_router(listener, router(state), shutdown).await
}

/// Serves `app` (e.g. `router(state)` merged with `observe::routes`) until
/// `shutdown`, finishing requests in flight.
pub async fn serve_router(listener: TcpListener, app: Router, shutdown: CancellationToken) -> std::io::Result<()> {
    axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await }).await
}

/// Bound address helper for callers that asked for port 0.
pub fn local_url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

async fn create_export(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, Problem> {
    let caller = state.tokens.caller(&headers)?;
    let key = idempotency_key(&headers)?;
    let request = ExportRequest::from_json(&body)?;
    let submitted = jobs::submit(&state.db, &state.intake, &caller, &key, &request).await?;
    let job = submitted.job();
    // A repeat of a finished job answers 200 with the job; anything still in
    // flight answers 202 like the first time, so a retry after a lost
    // response looks like the response it lost.
    let status = if job.status == jobs::PENDING { StatusCode::ACCEPTED } else { StatusCode::OK };
    let location = format!("/v1/exports/{}", job.job_id);
    Ok((status, [(header::LOCATION, location)], Json(json!({"job_id": job.job_id, "status": job.status}))).into_response())
}

fn idempotency_key(headers: &HeaderMap) -> Result<String, Problem> {
    let value = headers.get("idempotency-key").ok_or_else(|| Problem::bad_request("missing Idempotency-Key header"))?;
    let key = value.to_str().map_err(|_| Problem::bad_request("Idempotency-Key must be visible ASCII"))?.trim();
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(Problem::bad_request(format!("Idempotency-Key must be 1 to {MAX_KEY_LEN} characters")));
    }
    Ok(key.to_owned())
}

/// The caller's job; a deleted one answers 410 Gone (only its owner learns
/// that it existed).
async fn get_export(State(state): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Result<Json<Job>, Problem> {
    let caller = state.tokens.caller(&headers)?;
    let job = jobs::get(&state.db, &caller, &id).await?.ok_or_else(Problem::not_found)?;
    if job.status == jobs::DELETED {
        return Err(deleted(&job));
    }
    Ok(Json(job))
}

fn deleted(job: &Job) -> Problem {
    Problem::gone(format!("export {} was deleted", job.job_id))
}

/// Deletes the caller's job: 204 when it is (or already was) deleted — a
/// repeat is harmless; 409 while an attempt runs it; 404 for anyone else's.
async fn delete_export(State(state): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Result<StatusCode, Problem> {
    let caller = state.tokens.caller(&headers)?;
    match deletion::delete(&state.db, &state.intake.topics, &caller, &id).await? {
        Deletion::Deleted(_) | Deletion::AlreadyDeleted(_) => Ok(StatusCode::NO_CONTENT),
        Deletion::Running(job) => Err(Problem::running(format!("export {} is {}; delete it after it finished", job.job_id, job.status))),
        Deletion::NotFound => Err(Problem::not_found()),
    }
}

/// Streams the selected artifact. Only the owner learns that the job exists.
async fn get_result(State(state): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Result<Response, Problem> {
    let caller = state.tokens.caller(&headers)?;
    let job = jobs::get(&state.db, &caller, &id).await?.ok_or_else(Problem::not_found)?;
    if job.status == jobs::DELETED {
        return Err(deleted(&job));
    }
    let Some(result_id) = job.result_id.filter(|_| job.status == jobs::SUCCEEDED) else {
        return Err(Problem::not_ready(format!("export is {}", job.status)));
    };
    let stream = state.artifacts.open(&result_id).await?;
    let content_type = if job.format == "json" { "application/json" } else { "text/csv; charset=utf-8" };
    let mut response = Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static(content_type));
    if let Some(sha) = job.result_sha256.as_deref().and_then(|s| header::HeaderValue::from_str(s).ok()) {
        headers.insert("x-content-sha256", sha);
    }
    Ok(response)
}

#[derive(Debug, Deserialize)]
struct SearchParams {
    #[serde(default)]
    q: String,
}

async fn search_exports(
    State(state): State<AppState>,
    headers: HeaderMap,
    params: Result<Query<SearchParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<search::SearchResults>, Problem> {
    let caller = state.tokens.caller(&headers)?;
    let Query(params) = params.map_err(|e| Problem::bad_request(e.body_text()))?;
    if params.q.chars().count() > MAX_SEARCH_CHARS {
        return Err(Problem::bad_request(format!("q is longer than {MAX_SEARCH_CHARS} characters")));
    }
    Ok(Json(search::search(&state.db, &caller, &params.q, SEARCH_LIMIT).await?))
}
