//! Herald's HTTP edge (axum): intake and reads for export owners.
//!
//! - [`auth`]: bearer tokens → callers.
//! - [`problem`]: every error as `application/problem+json` (RFC 9457).
//! - [`routes`]: the endpoints; each answers only after its transaction
//!   committed, so a 202 is a promise the database already keeps.
//! - [`limits`]: concurrency, per-caller rate and body size, refused with 429/413.
//! - [`observe`]: `/metrics`, `/status`, `/status.json` from a `herald_status::Monitor`.
//! - [`trace`]: a span per request, continuing the caller's `traceparent`.
//! - [`openapi`]: the OpenAPI document of all of them, `/openapi.json`.

pub mod auth;
pub mod limits;
pub mod observe;
pub mod openapi;
pub mod problem;
pub mod ready;
pub mod routes;
pub mod schemas;
pub mod trace;

pub use auth::Tokens;
pub use routes::{AppState, router, serve, serve_router};
