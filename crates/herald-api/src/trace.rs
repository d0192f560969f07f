//! One span per HTTP request. A request that carries a W3C `traceparent`
//! continues that trace, so the export it creates — its command, attempt,
//! completion record and notification — is found under the caller's trace id.

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use herald_envelope::TraceContext;
use tracing::Instrument;
use tracing::field::Empty;

/// The middleware: `http.request`, named by method and route template (not
/// the path, whose ids would make every span name unique).
pub async fn request_span(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str).to_owned();
    let span = tracing::info_span!(
        parent: None,
        "http.request",
        "http.request.method" = %request.method(),
        "http.route" = %route,
        "http.response.status_code" = Empty,
    );
    herald_trace::set_parent(&span, incoming(request.headers()).as_ref());
    let response = next.run(request).instrument(span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    response
}

/// The caller's trace context; a malformed one is ignored (a new trace starts).
fn incoming(headers: &HeaderMap) -> Option<TraceContext> {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    TraceContext::parse(text("traceparent")?, text("tracestate"))
}
