//! `GET /schemas` and `GET /schemas/{file}`: every event schema this process
//! reads with (compiled in, and deployed with `--schemas`), so a consumer
//! outside Herald can resolve a record's `dataschema` — set the relay's
//! `--dataschema-base` to this route's URL and the `dataschema` of Herald's
//! records points here. Open like `/healthz`: schemas are the published
//! contract of the events, not a caller's data.

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use herald_envelope::Registry;

use crate::problem::Problem;

pub fn routes(registry: Registry) -> Router {
    Router::new()
        .route("/schemas", get(list_schemas))
        .route("/schemas/{file}", get(get_schema))
        .method_not_allowed_fallback(|| async { Problem::method_not_allowed() })
        .with_state(registry)
}

/// The schema files this process knows, by name.
#[utoipa::path(get, path = "/schemas", tag = "operations",
    responses((status = 200, description = "Every `<subject>.v<N>.avsc` this process reads with", body = Vec<String>)))]
pub(crate) async fn list_schemas(State(registry): State<Registry>) -> Json<Vec<String>> {
    Json(registry.files().map(str::to_owned).collect())
}

/// One schema file, as written (Avro schema JSON).
#[utoipa::path(get, path = "/schemas/{file}", tag = "operations",
    params(("file" = String, Path, description = "`<subject>.v<N>.avsc`, the last segment of a record's `dataschema`")),
    responses(
        (status = 200, description = "The Avro schema: its JSON text as written", body = String, content_type = "application/json"),
        (status = 404, description = "No schema of that name", body = Problem, content_type = "application/problem+json"),
    ))]
pub(crate) async fn get_schema(State(registry): State<Registry>, Path(file): Path<String>) -> Response {
    match registry.text(&file) {
        Some(text) => ([(header::CONTENT_TYPE, "application/json")], text.to_owned()).into_response(),
        None => Problem::not_found().into_response(),
    }
}
