//! W3C trace context as an event carries it: the CloudEvents
//! distributed-tracing extension (`traceparent`, `tracestate`; `ce_` headers
//! in Kafka binary mode), stored with the outbox row and the notification
//! intent so a relay, a subscription or a dispatcher joins the trace of the
//! request that caused the event. Plain text here; spans are herald-trace's.

/// A `traceparent` in the W3C format (`00-<32 hex>-<16 hex>-<2 hex>`, ids not
/// all zero) and its optional `tracestate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

/// Longest `tracestate` kept: the W3C limit is 32 members of at most 256
/// characters each; a longer value is dropped, not truncated (a cut member
/// would be wrong).
const MAX_TRACESTATE: usize = 8192;

impl TraceContext {
    /// The context if `traceparent` is well formed; a malformed one is no
    /// context at all (W3C: the receiver starts a new trace), never an error
    /// that would refuse the event carrying it.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        if !valid_traceparent(traceparent) {
            return None;
        }
        let tracestate = tracestate.filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE && s.is_ascii()).map(str::to_owned);
        Some(TraceContext { traceparent: traceparent.to_ascii_lowercase(), tracestate })
    }

    /// The 32 hex digits that name the trace.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The 16 hex digits of the span that was current when it was taken.
    pub fn span_id(&self) -> &str {
        &self.traceparent[36..52]
    }
}

fn valid_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    let zero = |s: &str| s.bytes().all(|b| b == b'0');
    match parts.as_slice() {
        // Version ff is forbidden; a later version may append fields, which
        // this reader does not know, so only 00 is taken.
        [version, trace, span, flags] => {
            *version == "00" && hex(trace, 32) && hex(span, 16) && hex(flags, 2) && !zero(trace) && !zero(span)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_well_formed_traceparent_names_its_ids() {
        let ctx = TraceContext::parse(GOOD, Some("congo=t61rcWkgMzE")).expect("valid");
        assert_eq!(ctx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ctx.span_id(), "00f067aa0ba902b7");
        assert_eq!(ctx.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
    }

    #[test]
    fn malformed_traceparents_are_no_context() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(TraceContext::parse(bad, None), None, "{bad}");
        }
    }

    #[test]
    fn an_empty_or_oversized_tracestate_is_dropped() {
        assert_eq!(TraceContext::parse(GOOD, Some("")).expect("valid").tracestate, None);
        let long = "a=".to_owned() + &"b".repeat(MAX_TRACESTATE);
        assert_eq!(TraceContext::parse(GOOD, Some(&long)).expect("valid").tracestate, None);
    }
}
