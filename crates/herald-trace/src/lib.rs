//! Herald's log lines and spans (issue 22).
//!
//! Every process installs two layers: the log lines (text or JSON on stderr,
//! filtered by `HERALD_LOG`/`RUST_LOG`) and an OpenTelemetry layer that gives
//! Herald's spans W3C trace and span ids. The ids exist whether or not a
//! collector listens, so trace context is always stored with outbox rows and
//! notification intents and always travels as `ce_traceparent`; spans leave
//! the process only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or its `_TRACES_`
//! form) is set, over OTLP HTTP/protobuf with the standard `OTEL_*` variables.
//!
//! Every line has ids: commands and roles run inside [`run_span`], a root of
//! its own, and units of work start their own traces.
//!
//! Spans per record (the relay's publish, a subscription's apply) exist only
//! while spans are exported ([`recording`]): without a collector nobody
//! reads them, and at tens of thousands of records a second they would cost.

mod bridge;
mod context;
mod setup;

pub use bridge::process_span;
pub use context::{context_of, current, run_span, set_parent};
pub use setup::{LogFormat, Tracing, TracingError, init, recording};
