//! Installing the process's subscriber, and flushing spans at exit.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Level;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{Layer, Registry};

/// Log lines on stderr: text for people, JSON for collectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Why tracing could not start. Reject: the operator's `OTEL_*` settings
/// are wrong; nothing has run yet.
#[derive(Debug, thiserror::Error)]
pub enum TracingError {
    #[error("OTLP exporter: {0} (check OTEL_EXPORTER_OTLP_ENDPOINT and the other OTEL_* variables)")]
    Exporter(String),
    /// A bug: something installed a subscriber or a logger before us.
    #[error("installing the log subscriber: {0}")]
    Installed(String),
}

static RECORDING: AtomicBool = AtomicBool::new(false);

/// Whether spans leave this process (an OTLP endpoint is configured). Code
/// that would make a span per record asks this first.
pub fn recording() -> bool {
    RECORDING.load(Ordering::Relaxed)
}

/// The installed tracer provider. Dropping it (or [`Tracing::shutdown`])
/// exports the spans still buffered: call it after the runtime has stopped,
/// since the exporter's HTTP client blocks.
pub struct Tracing {
    provider: Option<SdkTracerProvider>,
}

impl Tracing {
    pub fn shutdown(mut self) {
        self.flush();
    }

    fn flush(&mut self) {
        crate::bridge::release();
        if let Some(provider) = self.provider.take()
            && recording()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: exporting the last spans failed: {e}");
        }
    }
}

impl Drop for Tracing {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Installs the log layer and the OpenTelemetry layer as the global
/// subscriber. `default_filter` applies when neither `HERALD_LOG` nor
/// `RUST_LOG` is set. The log filter does not decide which spans exist:
/// trace context is stored and propagated at any log level.
pub fn init(format: LogFormat, default_filter: &str) -> Result<Tracing, TracingError> {
    let provider = provider()?;
    let tracer = provider.tracer("herald");
    let spans = tracing_opentelemetry::layer().with_tracer(tracer).with_filter(herald_spans());
    let subscriber = tracing_subscriber::registry().with(logs(format, default_filter)).with(spans);
    tracing::subscriber::set_global_default(subscriber).map_err(|e| TracingError::Installed(e.to_string()))?;
    crate::bridge::install().map_err(|e| TracingError::Installed(e.to_string()))?;
    Ok(Tracing { provider: Some(provider) })
}

fn provider() -> Result<SdkTracerProvider, TracingError> {
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("herald");
    }
    let mut builder = SdkTracerProvider::builder().with_resource(resource.build());
    if exporting_configured() {
        let exporter =
            opentelemetry_otlp::SpanExporter::builder().with_http().build().map_err(|e| TracingError::Exporter(e.to_string()))?;
        builder = builder.with_batch_exporter(exporter);
        RECORDING.store(true, Ordering::Relaxed);
    }
    Ok(builder.build())
}

fn exporting_configured() -> bool {
    let set = |name| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
}

/// What the OpenTelemetry layer sees: Herald's spans and the lines logged
/// inside them (as span events), at `info` and above. A static filter: its
/// answer is cached per callsite, so nothing else reaches the layer.
fn herald_spans() -> Targets {
    Targets::new().with_target("herald", Level::INFO)
}

fn logs(format: LogFormat, default_filter: &str) -> Box<dyn Layer<Registry> + Send + Sync> {
    let filter = EnvFilter::try_from_env("HERALD_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new(default_filter));
    match format {
        LogFormat::Text => tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter).boxed(),
        LogFormat::Json => json_subscriber::layer()
            .with_current_span(true)
            .with_span_list(true)
            .flatten_event(true)
            .with_opentelemetry_ids(true)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
    }
}
