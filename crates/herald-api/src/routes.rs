use std::net::SocketAddr;

use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use herald_export::artifact::ArtifactStore;
use herald_export::deletion::{self, Deletion};
use herald_export::{ExportRequest, IntakeConfig, Job, jobs};
use herald_projections::search;
use herald_store::Db;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use utoipa::{IntoParams, ToSchema};

use crate::Tokens;
use crate::limits::SearchSlots;
use crate::openapi;
use crate::problem::Problem;

/// Longest accepted `Idempotency-Key`.
const MAX_KEY_LEN: usize = 255;
/// Most hits one search returns.
const SEARCH_LIMIT: i64 = 100;
/// Longest search text, in characters: longer ones are no real query,
/// only work for the database.
pub const MAX_SEARCH_CHARS: usize = 1024;
/// Largest `POST /v1/exports` body. A valid one is a few KiB (a query is at
/// most 4 KiB); axum's default of 2 MiB would only buffer more garbage.
const MAX_BODY_BYTES: usize = 64 * 1024;

#[derive(Clone)]
pub struct AppState {
    pub db: Db,
    pub intake: IntakeConfig,
    pub artifacts: ArtifactStore,
    pub tokens: Tokens,
    pub searches: SearchSlots,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi::openapi_json))
        .route("/v1/exports", post(create_export).layer(DefaultBodyLimit::max(MAX_BODY_BYTES)))
        .route("/v1/exports/{id}", get(get_export).delete(delete_export))
        .route("/v1/exports/{id}/result", get(get_result))
        .route("/v1/search", get(search_exports))
        // Unknown paths and methods answer like every other error, not
        // with an empty body (axum keeps the `Allow` header of a 405).
        .fallback(|| async { Problem::not_found() })
        .method_not_allowed_fallback(|| async { Problem::method_not_allowed() })
        .with_state(state)
}

/// Serves `router(state)` on `listener` until `shutdown`, finishing requests
/// in flight.
pub async fn serve(listener: TcpListener, state: AppState, shutdown: CancellationToken) -> std::io::Result<()> {
    serve_router(listener, router(state), shutdown).await
}

/// Serves `app` (e.g. `router(state)` merged with `observe::routes`) until
/// `shutdown`, finishing requests in flight. Every route, merged ones too,
/// answers inside an `http.request` span.
pub async fn serve_router(listener: TcpListener, app: Router, shutdown: CancellationToken) -> std::io::Result<()> {
    let app = app.layer(axum::middleware::from_fn(crate::trace::request_span));
    axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await }).await
}

/// Bound address helper for callers that asked for port 0.
pub fn local_url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

/// Liveness: the process answers HTTP. Needs no token.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The process is up", body = String, content_type = "text/plain", example = "ok")))]
async fn healthz() -> &'static str {
    "ok"
}

/// What intake answers: the job and where to read it.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExportAccepted {
    pub job_id: String,
    /// `pending` until a worker finished it.
    pub status: String,
}

/// Requests an export. A repeat with the same `Idempotency-Key` and body
/// creates nothing and answers for the job the first request created.
#[utoipa::path(post, path = "/v1/exports", tag = "exports", security(("bearer" = [])),
    params(("Idempotency-Key" = String, Header, min_length = 1, max_length = 255, pattern = r"^[\t\x20-\x7E]*[\x21-\x7E][\t\x20-\x7E]*$",
        description = "The caller's name for this request (visible ASCII, surrounding blanks ignored): a retry with the same key and body is the same request")),
    request_body(content = ExportRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "Accepted: the job is pending (also for a repeat while it still is)", body = ExportAccepted,
            headers(("Location" = String, description = "The job: `/v1/exports/{id}`"))),
        (status = 200, description = "A repeat of a request whose job already finished", body = ExportAccepted,
            headers(("Location" = String, description = "The job: `/v1/exports/{id}`"))),
        (status = 400, description = "`Idempotency-Key` missing or malformed, or the body could not be read", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The key was used before with another body", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body is larger than 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The body is not a valid export request (the detail names the field)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many unfinished exports", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "Storage failed: retry with the same key", body = Problem, content_type = "application/problem+json"),
    ))]
async fn create_export(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let caller = state.tokens.caller(&headers)?;
    let key = idempotency_key(&headers)?;
    let body = body.map_err(body_problem)?;
    let request = ExportRequest::from_json(&body)?;
    let intake = tracing::info_span!("export.intake", caller = %caller, job_id = tracing::field::Empty);
    let submitted = jobs::submit(&state.db, &state.intake, &caller, &key, &request).instrument(intake.clone()).await?;
    let job = submitted.job();
    intake.record("job_id", job.job_id.as_str());
    // A repeat of a finished job answers 200 with the job; anything still in
    // flight answers 202 like the first time, so a retry after a lost
    // response looks like the response it lost.
    let status = if job.status == jobs::PENDING { StatusCode::ACCEPTED } else { StatusCode::OK };
    let location = format!("/v1/exports/{}", job.job_id);
    let accepted = ExportAccepted { job_id: job.job_id.clone(), status: job.status.clone() };
    Ok((status, [(header::LOCATION, location)], Json(accepted)).into_response())
}

fn body_problem(rejection: BytesRejection) -> Problem {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        Problem::too_large(format!("the body must be at most {MAX_BODY_BYTES} bytes"))
    } else {
        Problem::bad_request(rejection.body_text())
    }
}

fn idempotency_key(headers: &HeaderMap) -> Result<String, Problem> {
    let value = headers.get("idempotency-key").ok_or_else(|| Problem::bad_request("missing Idempotency-Key header"))?;
    let key = value.to_str().map_err(|_| Problem::bad_request("Idempotency-Key must be visible ASCII"))?;
    // The length of the value as sent, like the documented `maxLength`, and
    // of what is left of it: blanks around a key are no part of it.
    if key.len() > MAX_KEY_LEN || key.trim().is_empty() {
        return Err(Problem::bad_request(format!("Idempotency-Key must be 1 to {MAX_KEY_LEN} characters")));
    }
    Ok(key.trim().to_owned())
}

/// The `{id}` of a path. No job id holds a control character (they are
/// UUIDs), and PostgreSQL cannot even compare text with a NUL in it: such an
/// id names no job.
fn job_id(path: Result<Path<String>, PathRejection>) -> Result<String, Problem> {
    let Path(id) = path.map_err(|e| Problem::bad_request(e.body_text()))?;
    if id.chars().any(char::is_control) {
        return Err(Problem::not_found());
    }
    Ok(id)
}

/// The caller's job; a deleted one answers 410 Gone (only its owner learns
/// that it existed).
#[utoipa::path(get, path = "/v1/exports/{id}", tag = "exports", security(("bearer" = [])),
    params(("id" = String, Path, description = "The `job_id` intake answered")),
    responses(
        (status = 200, description = "The job", body = Job),
        (status = 400, description = "The path is not valid UTF-8 once decoded", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job of this caller's", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The caller deleted this job", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage failed: retry", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_export(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Job>, Problem> {
    let caller = state.tokens.caller(&headers)?;
    let id = job_id(path)?;
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
#[utoipa::path(delete, path = "/v1/exports/{id}", tag = "exports", security(("bearer" = [])),
    params(("id" = String, Path, description = "The `job_id` intake answered")),
    responses(
        (status = 204, description = "Deleted, now or before"),
        (status = 400, description = "The path is not valid UTF-8 once decoded", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job of this caller's", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "An attempt is running the job: delete it after it finished", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage failed: retry", body = Problem, content_type = "application/problem+json"),
    ))]
async fn delete_export(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, Problem> {
    let caller = state.tokens.caller(&headers)?;
    let id = job_id(path)?;
    match deletion::delete(&state.db, &state.intake.topics, &caller, &id).await? {
        Deletion::Deleted(_) | Deletion::AlreadyDeleted(_) => Ok(StatusCode::NO_CONTENT),
        Deletion::Running(job) => Err(Problem::running(format!("export {} is {}; delete it after it finished", job.job_id, job.status))),
        Deletion::NotFound => Err(Problem::not_found()),
    }
}

/// Streams the selected artifact. Only the owner learns that the job exists.
#[utoipa::path(get, path = "/v1/exports/{id}/result", tag = "exports", security(("bearer" = [])),
    params(("id" = String, Path, description = "The `job_id` intake answered")),
    responses(
        (status = 200, description = "The result, in the job's format",
            content((String = "text/csv"), (Vec<openapi::ResultRow> = "application/json")),
            headers(("X-Content-SHA256" = String, description = "Hex SHA-256 of the body, as stored"))),
        (status = 400, description = "The path is not valid UTF-8 once decoded", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such job of this caller's", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The job has not succeeded (yet)", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The caller deleted this job", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage failed: retry", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_result(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, Problem> {
    let caller = state.tokens.caller(&headers)?;
    let id = job_id(path)?;
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

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct SearchParams {
    /// Text the export's query contains, any case; empty or absent: every one.
    #[serde(default)]
    #[param(max_length = 1024, pattern = r"^[^\u0000-\u001F\u007F-\u009F]*$")]
    q: String,
}

/// The caller's finished exports whose query contains `q`, newest first, at most 100.
#[utoipa::path(get, path = "/v1/search", tag = "exports", security(("bearer" = [])), params(SearchParams),
    responses(
        (status = 200, description = "The matches, from the projection's active generation", body = search::SearchResults),
        (status = 400, description = "`q` malformed (repeated, a control character, longer than 1024 characters)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Storage failed: retry", body = Problem, content_type = "application/problem+json"),
    ))]
async fn search_exports(
    State(state): State<AppState>,
    headers: HeaderMap,
    params: Result<Query<SearchParams>, QueryRejection>,
) -> Result<Json<search::SearchResults>, Problem> {
    let caller = state.tokens.caller(&headers)?;
    let Query(params) = params.map_err(|e| Problem::bad_request(e.body_text()))?;
    // Stored queries hold neither, so such a `q` could match nothing; and
    // PostgreSQL refuses a NUL in text outright.
    if params.q.chars().any(char::is_control) {
        return Err(Problem::bad_request("q: control characters are not allowed"));
    }
    if params.q.chars().count() > MAX_SEARCH_CHARS {
        return Err(Problem::bad_request(format!("q: longer than {MAX_SEARCH_CHARS} characters")));
    }
    let _slot = state.searches.acquire().await?;
    Ok(Json(search::search(&state.db, &caller, &params.q, SEARCH_LIMIT).await?))
}
