//! The OpenAPI document of everything `herald serve` answers over HTTP
//! ([`crate::router`] merged with [`crate::observe::routes`],
//! [`crate::ready::routes`] and [`crate::schemas::routes`]), served at
//! `GET /openapi.json`. It is assembled from the handlers' `#[utoipa::path]`
//! annotations and the schemas of the types they serialize, so that a
//! handler or a response type cannot change without the document seeing it.

use std::sync::OnceLock;

use axum::http::header;
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::problem::Problem;
use crate::{observe, ready, routes, schemas};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Herald",
        description = "Export intake and reads for export owners (bearer token), and what operators look at (no token). \
                       Every error is an RFC 9457 `application/problem+json` document."
    ),
    paths(
        routes::healthz,
        ready::readyz,
        routes::create_export,
        routes::get_export,
        routes::delete_export,
        routes::get_result,
        routes::search_exports,
        observe::metrics,
        observe::dashboard,
        observe::status_json,
        schemas::list_schemas,
        schemas::get_schema,
        openapi_json,
    ),
    components(schemas(Problem)),
    modifiers(&BearerAuth, &Limited),
    tags(
        (name = "exports", description = "A caller's exports: each caller sees only its own"),
        (name = "operations", description = "Liveness, figures and this document; no caller's data. On the API's listener the figures need the observer's token"),
    )
)]
struct ApiDoc;

/// The `bearer` scheme the export routes name: `HERALD_API_TOKENS` maps
/// each token to a caller.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some("`Authorization: Bearer <token>`, a token of `HERALD_API_TOKENS`"))
            .build();
        openapi.components.get_or_insert_with(Default::default).add_security_scheme("bearer", SecurityScheme::Http(scheme));
    }
}

/// `herald_api::limits` answers 429 on any route when the caller is over its
/// rate or the API at its concurrency limit: every operation says so.
struct Limited;

impl Modify for Limited {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let problem = ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build();
        let limited = ResponseBuilder::new()
            .description("Over the caller's rate or the API's concurrency limit: retry after `Retry-After` seconds")
            .content("application/problem+json", problem)
            .build();
        for item in openapi.paths.paths.values_mut() {
            for operation in [&mut item.get, &mut item.post, &mut item.delete].into_iter().flatten() {
                operation.responses.responses.entry("429".to_owned()).or_insert_with(|| limited.clone().into());
            }
        }
    }
}

/// The document, as `GET /openapi.json` serves it.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// One row of a JSON result, as `herald_export::artifact::render` writes it
/// (with `json!`: a test here holds the two together).
#[derive(Debug, Serialize, ToSchema)]
#[cfg_attr(test, derive(serde::Deserialize), serde(deny_unknown_fields))]
pub struct ResultRow {
    /// 1, 2, …
    pub row: i64,
    pub text: String,
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", body = Object)))]
pub(crate) async fn openapi_json() -> impl IntoResponse {
    static JSON: OnceLock<String> = OnceLock::new();
    // Serializing maps and strings cannot fail; the document is the same
    // for the life of the process, so it is built once.
    let json = JSON.get_or_init(|| document().to_json().expect("the OpenAPI document serializes"));
    ([(header::CONTENT_TYPE, "application/json")], json.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_export::Job;

    #[test]
    fn json_results_are_rows() {
        let mut job = Job {
            job_id: "j".into(),
            caller: "alice".into(),
            format: "json".into(),
            query: "q \"quoted\"".into(),
            status: "running".into(),
            version: 1,
            generation: 1,
            attempts: 1,
            failures: 0,
            last_error: None,
            result_id: None,
            result_size: None,
            result_sha256: None,
            created_at_ms: 0,
            completed_at_ms: None,
            lease_expires_at_ms: None,
        };
        let rows: Vec<ResultRow> = serde_json::from_slice(&herald_export::artifact::render(&job)).expect("rows");
        assert!(!rows.is_empty());
        assert!(rows.iter().all(|r| r.row > 0 && r.text.starts_with("q \"quoted\"")), "{rows:?}");
        job.format = "csv".into();
        assert!(serde_json::from_slice::<serde_json::Value>(&herald_export::artifact::render(&job)).is_err(), "csv is not JSON");
    }

    #[test]
    fn every_schema_reference_resolves() {
        let doc = serde_json::to_value(document()).expect("json");
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        let mut refs = Vec::new();
        collect_refs(&doc, &mut refs);
        assert!(refs.len() > 10, "{refs:?}");
        for reference in refs {
            let name = reference.strip_prefix("#/components/schemas/").unwrap_or(&reference);
            assert!(schemas.contains_key(name), "{reference} is not in components.schemas");
        }
    }

    fn collect_refs(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(r)) = map.get("$ref") {
                    out.push(r.clone());
                }
                map.values().for_each(|v| collect_refs(v, out));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
            _ => {}
        }
    }
}
