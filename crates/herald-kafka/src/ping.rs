//! Does the cluster answer? One long-lived client for readiness probes, so a
//! probe costs one metadata request, not a new client's connections (and
//! TLS handshakes) each time.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::{BaseProducer, Producer};

use crate::KafkaConfig;

#[derive(Clone)]
pub struct BrokerPing {
    client: Arc<BaseProducer>,
}

impl BrokerPing {
    /// Fails only on settings librdkafka refuses (the same as every role's).
    pub fn new(kafka: &KafkaConfig) -> Result<BrokerPing, rdkafka::error::KafkaError> {
        Ok(BrokerPing { client: Arc::new(kafka.admin().create()?) })
    }

    /// `Ok` when a broker answered a metadata request within `within`; the
    /// error says why not (for the log, not for callers outside the process).
    pub async fn answers(&self, within: Duration) -> Result<(), String> {
        let client = self.client.clone();
        tokio::task::spawn_blocking(move || client.client().fetch_metadata(None, within).map(|_| ()).map_err(|e| e.to_string()))
            .await
            .map_err(|e| format!("the metadata request did not finish: {e}"))?
    }
}
