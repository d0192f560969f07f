use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use herald_export::ExportError;
use serde::Serialize;
use tracing::error;
use utoipa::ToSchema;

/// An RFC 9457 problem document (`application/problem+json`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Problem {
    #[serde(skip)]
    pub status: StatusCode,
    /// What went wrong, as a URI reference relative to the API (`/problems/quota`).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The same for every problem of this type.
    pub title: &'static str,
    /// This occurrence, in words.
    pub detail: String,
    /// The HTTP status of the response.
    #[serde(rename = "status")]
    #[schema(minimum = 400, maximum = 599)]
    pub status_code: u16,
    /// This occurrence, for a failure whose cause stays in the log: the log
    /// line carries the same id (`problem_id`), the answer nothing internal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    #[serde(skip)]
    pub retry_after_secs: Option<u64>,
}

impl Problem {
    fn new(status: StatusCode, kind: &'static str, title: &'static str, detail: impl Into<String>) -> Problem {
        Problem { status, kind, title, detail: detail.into(), status_code: status.as_u16(), instance: None, retry_after_secs: None }
    }

    pub fn unauthorized(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::UNAUTHORIZED, "/problems/unauthorized", "Unauthorized", detail)
    }

    pub fn bad_request(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, "/problems/bad-request", "Bad request", detail)
    }

    pub fn invalid(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "/problems/invalid-body", "Invalid request body", detail)
    }

    /// A body longer than the route accepts.
    pub fn too_large(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::PAYLOAD_TOO_LARGE, "/problems/too-large", "Request body too large", detail)
    }

    pub fn not_found() -> Problem {
        Problem::new(StatusCode::NOT_FOUND, "/problems/not-found", "Not found", "no such resource for this caller")
    }

    /// The path exists, the method does not (the `Allow` header lists those that do).
    pub fn method_not_allowed() -> Problem {
        Problem::new(StatusCode::METHOD_NOT_ALLOWED, "/problems/method-not-allowed", "Method not allowed", "see the Allow header")
    }

    /// The resource existed and was deleted by its owner (GET of a deleted export).
    pub fn gone(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::GONE, "/problems/gone", "Deleted", detail)
    }

    /// A delete of an export whose attempt is running: retry after it finished.
    pub fn running(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::CONFLICT, "/problems/export-running", "Export is running", detail)
    }

    pub fn conflict(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::CONFLICT, "/problems/key-conflict", "Idempotency key conflict", detail)
    }

    pub fn not_ready(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::CONFLICT, "/problems/not-ready", "Result not ready", detail)
    }

    pub fn too_many(detail: impl Into<String>, retry_after_secs: u64) -> Problem {
        let mut p = Problem::new(StatusCode::TOO_MANY_REQUESTS, "/problems/quota", "Too many unfinished exports", detail);
        p.retry_after_secs = Some(retry_after_secs);
        p
    }

    /// The caller sent more requests than its rate, or the API is at its
    /// concurrency limit: retry after the given seconds.
    pub fn rate_limited(detail: impl Into<String>, retry_after_secs: u64) -> Problem {
        let mut p = Problem::new(StatusCode::TOO_MANY_REQUESTS, "/problems/rate-limited", "Too many requests", detail);
        p.retry_after_secs = Some(retry_after_secs);
        p
    }

    /// `GET /readyz`: a dependency does not answer or a role is not running.
    pub fn unready(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::SERVICE_UNAVAILABLE, "/problems/unready", "Process not ready", detail)
    }

    /// Infrastructure failure: the caller may retry with the same key.
    pub fn unavailable(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::SERVICE_UNAVAILABLE, "/problems/unavailable", "Temporarily unavailable", detail)
    }
}

impl From<ExportError> for Problem {
    fn from(e: ExportError) -> Problem {
        match e {
            ExportError::Invalid(detail) => Problem::invalid(detail),
            ExportError::QuotaExceeded { open, quota, retry_after_secs } => {
                Problem::too_many(format!("{open} exports unfinished, at most {quota} allowed; retry later"), retry_after_secs)
            }
            ExportError::KeyConflict { .. } => Problem::conflict("this Idempotency-Key was already used with different parameters"),
            other => {
                let id = uuid::Uuid::new_v4().simple().to_string();
                error!(error = %other, problem_id = %id, "request failed");
                let mut problem = Problem::unavailable(format!(
                    "storage unavailable or busy; retry later (a POST with the same Idempotency-Key) (problem {id})"
                ));
                // Busy is the common case (the API's own pool exhausted, a
                // statement timed out): a second is enough to come back.
                problem.retry_after_secs = Some(1);
                problem.instance = Some(format!("urn:herald:problem:{id}"));
                problem
            }
        }
    }
}

impl From<herald_store::StoreError> for Problem {
    fn from(e: herald_store::StoreError) -> Problem {
        ExportError::Store(e).into()
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (self.status, [(header::CONTENT_TYPE, "application/problem+json")], body).into_response();
        if let Some(secs) = self.retry_after_secs {
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
        response
    }
}
