//! Between a span and the text form of its trace context.

use std::collections::HashMap;

use herald_envelope::TraceContext;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The trace context of the current span, to store with what it writes.
pub fn current() -> Option<TraceContext> {
    context_of(&Span::current())
}

/// The trace context of `span`; `None` when it has no ids (a disabled span,
/// or no OpenTelemetry layer installed, as in unit tests).
pub fn context_of(span: &Span) -> Option<TraceContext> {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    TraceContext::parse(carrier.get("traceparent")?, carrier.get("tracestate").map(String::as_str))
}

/// The root span a command or a long-running role runs in, so the lines it
/// logs outside any unit of work (start-up, claims, rebalances, shutdown)
/// still carry trace and span ids: one trace per role per process. Units of
/// work (a request, a publish, an apply, an attempt, a provider call) start
/// traces of their own (`parent: None`) and never join it. The span is
/// started at once so its events go to the SDK span, whose limit (128 events)
/// bounds what a role running for weeks keeps in memory.
pub fn run_span(role: &str) -> Span {
    let span = tracing::info_span!(parent: None, "herald.run", role);
    let _ = span.context();
    span
}

/// Makes `span` a child of the span `trace` names, so it continues that
/// trace; `None` leaves it a root. Call before the span is entered.
pub fn set_parent(span: &Span, trace: Option<&TraceContext>) {
    let Some(trace) = trace else {
        return;
    };
    let mut carrier = HashMap::from([("traceparent".to_owned(), trace.traceparent.clone())]);
    if let Some(state) = &trace.tracestate {
        carrier.insert("tracestate".to_owned(), state.clone());
    }
    let parent = TraceContextPropagator::new().extract(&carrier);
    // Fails only for a span without the layer (disabled, or no layer):
    // such a span has no trace to continue.
    let _ = span.set_parent(parent);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    fn with_layer(f: impl FnOnce()) {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "test");
        let subscriber = tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
        tracing::subscriber::with_default(subscriber, f);
    }

    #[test]
    fn a_child_continues_the_trace_it_is_given() {
        with_layer(|| {
            let given = TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Some("k=v")).expect("valid");
            let span = tracing::info_span!("child");
            set_parent(&span, Some(&given));
            let own = context_of(&span).expect("the span has ids");
            assert_eq!(own.trace_id(), given.trace_id(), "same trace");
            assert_ne!(own.span_id(), given.span_id(), "its own span");
            assert_eq!(own.tracestate.as_deref(), Some("k=v"), "tracestate passes on");
        });
    }

    #[test]
    fn a_root_span_starts_a_trace_and_spans_in_it_share_it() {
        with_layer(|| {
            let root = tracing::info_span!("root");
            let inner = root.in_scope(|| {
                let inner = tracing::info_span!("inner");
                inner.in_scope(current).expect("inner has ids")
            });
            let root = context_of(&root).expect("root has ids");
            assert_eq!(inner.trace_id(), root.trace_id());
            assert_ne!(inner.span_id(), root.span_id());
        });
    }

    #[test]
    fn without_the_layer_there_is_no_context() {
        let span = tracing::info_span!("alone");
        assert_eq!(context_of(&span), None);
    }
}
