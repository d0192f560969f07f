//! The provider contract as seen from Herald: one HTTP call per attempt,
//! always the same `Idempotency-Key` and the same body for one intent, and a
//! faithful report of what came back (or that nothing did) — what it proves
//! is decided by [`crate::rules`].

use std::time::Duration;

use herald_envelope::TraceContext;
use serde::{Deserialize, Serialize};

/// What Herald may assume about a provider. Configuration, not discovery:
/// a provider that does not honour keys must never be treated as if it did,
/// so every capability defaults to the cautious answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// The provider collapses requests with the same `Idempotency-Key` and body.
    pub honours_keys: bool,
    /// How long the provider remembers a key; past this a resend is a new effect.
    pub key_retention: Duration,
    /// `GET /v1/notifications/{key}` answers whether the key was accepted.
    pub queryable: bool,
    /// A 5xx answer means the provider did not execute the request. Few
    /// providers promise this: a gateway can answer 502/504 after the
    /// provider behind it executed.
    pub server_errors_safe: bool,
}

impl Capabilities {
    pub fn keyed(key_retention: Duration) -> Capabilities {
        Capabilities { honours_keys: true, key_retention, queryable: true, server_errors_safe: false }
    }

    pub fn unkeyed() -> Capabilities {
        Capabilities { honours_keys: false, key_retention: Duration::ZERO, queryable: false, server_errors_safe: false }
    }
}

/// What one call proved; [`crate::rules`] decides what it means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// 2xx with a receipt: the provider accepted this key and body.
    Accepted { receipt: String },
    /// Any other status, its body read up to `MAX_BODY_BYTES`. `retry_after`: the provider's
    /// `Retry-After`, as a delay.
    Answered { status: u16, retry_after: Option<Duration>, detail: String },
    /// The request provably did not reach the provider (connection refused,
    /// no route).
    NotSent { reason: String },
    /// The request may have arrived and been executed; no answer proves either
    /// way (timeout, reset, unreadable answer, 2xx without a receipt).
    Unknown { reason: String },
}

/// What the provider says about a key when asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyStatus {
    Accepted { receipt: String },
    NotFound,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ReceiptBody {
    pub receipt: String,
}

/// HTTP client of one provider.
#[derive(Debug, Clone)]
pub struct ProviderClient {
    http: reqwest::Client,
    base: String,
    timeout: Duration,
}

impl ProviderClient {
    pub fn new(base_url: &str, timeout: Duration) -> Result<ProviderClient, reqwest::Error> {
        let http = reqwest::Client::builder().timeout(timeout).connect_timeout(timeout.min(Duration::from_secs(5))).build()?;
        Ok(ProviderClient { http, base: base_url.trim_end_matches('/').to_owned(), timeout })
    }

    /// The longest one call lasts, connecting and reading the answer included.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// One attempt. The body is sent byte for byte as stored, so a retry is
    /// the same request, not a re-serialisation that might differ.
    /// `trace` goes as the W3C `traceparent` (and `tracestate`) headers.
    pub async fn send(&self, key: &str, body: &str, trace: Option<&TraceContext>) -> SendOutcome {
        let mut request = self
            .http
            .post(format!("{}/v1/notifications", self.base))
            .header("idempotency-key", key)
            .header("content-type", "application/json");
        if let Some(trace) = trace {
            request = request.header("traceparent", &trace.traceparent);
            if let Some(state) = &trace.tracestate {
                request = request.header("tracestate", state);
            }
        }
        let sent = request.body(body.to_owned()).send().await;
        let response = match sent {
            Ok(response) => response,
            Err(e) if e.is_connect() => return SendOutcome::NotSent { reason: error_chain(&e) },
            Err(e) if e.is_timeout() => {
                return SendOutcome::Unknown { reason: format!("{NO_ANSWER} within the call timeout ({:?})", self.timeout) };
            }
            Err(e) => return SendOutcome::Unknown { reason: format!("{NO_ANSWER}: {}", error_chain(&e)) },
        };
        let status = response.status();
        let retry_after = retry_after_of(response.headers());
        let (text, cut) = match read_capped(response).await {
            Ok(read) => read,
            // The status line came but the answer did not: no evidence of success.
            Err(e) => return SendOutcome::Unknown { reason: format!("{status} with unreadable body: {e}") },
        };
        if cut && status.is_success() {
            // A receipt is small; a 2xx whose body does not fit is not one
            // Herald can read, so it is no evidence either way.
            return SendOutcome::Unknown { reason: format!("{status} with a body over {MAX_BODY_BYTES} bytes, not read") };
        }
        classify(status.as_u16(), retry_after, text)
    }

    /// Asks a queryable provider whether it accepted `key`.
    pub async fn status(&self, key: &str) -> Result<KeyStatus, String> {
        let response = self.http.get(format!("{}/v1/notifications/{key}", self.base)).send().await.map_err(|e| e.to_string())?;
        match response.status().as_u16() {
            404 => Ok(KeyStatus::NotFound),
            200..=299 => {
                let (text, cut) = read_capped(response).await.map_err(|e| e.to_string())?;
                if cut {
                    return Err(format!("status answer over {MAX_BODY_BYTES} bytes, not read"));
                }
                let body: ReceiptBody = serde_json::from_str(&text).map_err(|e| e.to_string())?;
                Ok(KeyStatus::Accepted { receipt: body.receipt })
            }
            other => Err(format!("provider answered {other} to a status query")),
        }
    }
}

/// How the reason of a call that got no answer begins.
pub const NO_ANSWER: &str = "no answer";

/// Most bytes of a provider's answer Herald reads. A provider is another
/// party: an endless or huge body must not exhaust the dispatcher's memory,
/// and what Herald needs (a receipt, an error's first words) is small.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The body, at most [`MAX_BODY_BYTES`] of it, and whether more was cut.
async fn read_capped(mut response: reqwest::Response) -> Result<(String, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = MAX_BODY_BYTES - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((String::from_utf8_lossy(&body).into_owned(), true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((String::from_utf8_lossy(&body).into_owned(), false))
}

/// An error with its causes: reqwest's own message names only the URL.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn classify(status: u16, retry_after: Option<Duration>, text: String) -> SendOutcome {
    if !(200..=299).contains(&status) {
        return SendOutcome::Answered { status, retry_after, detail: text };
    }
    match serde_json::from_str::<ReceiptBody>(&text) {
        Ok(body) if !body.receipt.is_empty() => SendOutcome::Accepted { receipt: body.receipt },
        _ => SendOutcome::Unknown { reason: format!("{status} without a receipt: {text}") },
    }
}

/// `Retry-After` as a delay. A date is measured against the answer's own
/// `Date` (the provider's clock, which set it), else against ours.
fn retry_after_of(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let reference = text(reqwest::header::DATE).and_then(parse_http_date).unwrap_or_else(herald_store::now_ms);
    parse_retry_after(text(reqwest::header::RETRY_AFTER)?, reference)
}

/// Delay-seconds or an HTTP-date (RFC 9110 §10.2.3); a date in the past is
/// no delay. `reference_ms`: "now" for a date.
pub fn parse_retry_after(value: &str, reference_ms: i64) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = parse_http_date(value)?;
    Some(Duration::from_millis(u64::try_from(at.saturating_sub(reference_ms)).unwrap_or(0)))
}

fn parse_http_date(value: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc2822(value.trim()).ok().map(|t| t.timestamp_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_receipt_is_evidence_of_success() {
        assert_eq!(classify(200, None, r#"{"receipt":"r1"}"#.into()), SendOutcome::Accepted { receipt: "r1".into() });
        assert!(matches!(classify(200, None, "ok".into()), SendOutcome::Unknown { .. }));
        assert!(matches!(classify(201, None, r#"{"receipt":""}"#.into()), SendOutcome::Unknown { .. }));
    }

    #[test]
    fn other_statuses_are_reported_whole_for_the_rules() {
        let wait = Some(Duration::from_secs(3));
        assert_eq!(classify(429, wait, "busy".into()), SendOutcome::Answered { status: 429, retry_after: wait, detail: "busy".into() });
        assert!(matches!(classify(503, None, r#"{"receipt":"r1"}"#.into()), SendOutcome::Answered { status: 503, .. }));
    }

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        assert_eq!(parse_retry_after(" 120 ", 0), Some(Duration::from_secs(120)));
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        let at = parse_http_date(date).expect("IMF-fixdate");
        assert_eq!(at, 784_111_777_000);
        assert_eq!(parse_retry_after(date, at - 90_000), Some(Duration::from_secs(90)));
        assert_eq!(parse_retry_after(date, at + 5_000), Some(Duration::ZERO), "a date in the past is no delay");
        assert_eq!(parse_retry_after("soon", 0), None);
    }

    #[tokio::test]
    async fn refused_connection_is_not_sent() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let client = ProviderClient::new(&format!("http://{addr}"), Duration::from_secs(2)).unwrap();
        assert!(matches!(client.send("k", "{}", None).await, SendOutcome::NotSent { .. }));
    }
}
