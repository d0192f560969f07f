//! The provider contract as seen from Herald: one HTTP call per attempt,
//! always the same `Idempotency-Key` and the same body for one intent, and an
//! honest classification of what the answer (or its absence) proves.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What Herald may assume about a provider. Configuration, not discovery:
/// a provider that does not honour keys must never be treated as if it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// The provider collapses requests with the same `Idempotency-Key` and body.
    pub honours_keys: bool,
    /// How long the provider remembers a key; past this a resend is a new effect.
    pub key_retention: Duration,
    /// `GET /v1/notifications/{key}` answers whether the key was accepted.
    pub queryable: bool,
}

impl Capabilities {
    pub fn keyed(key_retention: Duration) -> Capabilities {
        Capabilities { honours_keys: true, key_retention, queryable: true }
    }

    pub fn unkeyed() -> Capabilities {
        Capabilities { honours_keys: false, key_retention: Duration::ZERO, queryable: false }
    }
}

/// What one call proved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// 2xx with a receipt: the provider accepted this key and body.
    Accepted { receipt: String },
    /// 409: the key is taken by another body; the old effect stands.
    Conflict { detail: String },
    /// Another 4xx: the provider refuses this request for good.
    Rejected { status: u16, detail: String },
    /// The request provably did not reach the provider (connection refused,
    /// no route) or the provider said it did not process it (5xx): resend.
    NotSent { reason: String },
    /// The request may have arrived and been executed; no answer proves either
    /// way (timeout, reset, unreadable answer).
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
}

impl ProviderClient {
    pub fn new(base_url: &str, timeout: Duration) -> Result<ProviderClient, reqwest::Error> {
        let http = reqwest::Client::builder().timeout(timeout).connect_timeout(timeout.min(Duration::from_secs(5))).build()?;
        Ok(ProviderClient { http, base: base_url.trim_end_matches('/').to_owned() })
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// One attempt. The body is sent byte for byte as stored, so a retry is
    /// the same request, not a re-serialisation that might differ.
    pub async fn send(&self, key: &str, body: &str) -> SendOutcome {
        let sent = self
            .http
            .post(format!("{}/v1/notifications", self.base))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(e) if e.is_connect() => return SendOutcome::NotSent { reason: e.to_string() },
            Err(e) => return SendOutcome::Unknown { reason: e.to_string() },
        };
        let status = response.status();
        let text = match response.text().await {
            Ok(text) => text,
            // The status line came but the answer did not: no evidence of success.
            Err(e) => return SendOutcome::Unknown { reason: format!("{status} with unreadable body: {e}") },
        };
        classify(status.as_u16(), text)
    }

    /// Asks a queryable provider whether it accepted `key`.
    pub async fn status(&self, key: &str) -> Result<KeyStatus, String> {
        let response = self
            .http
            .get(format!("{}/v1/notifications/{key}", self.base))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        match response.status().as_u16() {
            404 => Ok(KeyStatus::NotFound),
            200..=299 => {
                let body: ReceiptBody = response.json().await.map_err(|e| e.to_string())?;
                Ok(KeyStatus::Accepted { receipt: body.receipt })
            }
            other => Err(format!("provider answered {other} to a status query")),
        }
    }
}

fn classify(status: u16, text: String) -> SendOutcome {
    match status {
        200..=299 => match serde_json::from_str::<ReceiptBody>(&text) {
            Ok(body) if !body.receipt.is_empty() => SendOutcome::Accepted { receipt: body.receipt },
            _ => SendOutcome::Unknown { reason: format!("{status} without a receipt: {text}") },
        },
        409 => SendOutcome::Conflict { detail: text },
        400..=499 => SendOutcome::Rejected { status, detail: text },
        _ => SendOutcome::NotSent { reason: format!("provider answered {status}: {text}") },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_receipt_is_evidence_of_success() {
        assert_eq!(classify(200, r#"{"receipt":"r1"}"#.into()), SendOutcome::Accepted { receipt: "r1".into() });
        assert!(matches!(classify(200, "ok".into()), SendOutcome::Unknown { .. }));
        assert!(matches!(classify(201, r#"{"receipt":""}"#.into()), SendOutcome::Unknown { .. }));
    }

    #[test]
    fn conflict_rejection_and_server_errors_are_told_apart() {
        assert!(matches!(classify(409, "taken".into()), SendOutcome::Conflict { .. }));
        assert!(matches!(classify(422, "bad".into()), SendOutcome::Rejected { status: 422, .. }));
        assert!(matches!(classify(503, "busy".into()), SendOutcome::NotSent { .. }));
    }

    #[tokio::test]
    async fn refused_connection_is_not_sent() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let client = ProviderClient::new(&format!("http://{addr}"), Duration::from_secs(2)).unwrap();
        assert!(matches!(client.send("k", "{}").await, SendOutcome::NotSent { .. }));
    }
}
