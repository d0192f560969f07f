//! The check every role makes before it starts work: can this
//! configuration reach the cluster and authenticate?
//!
//! librdkafka never gives up on a broker: with a wrong SASL password or an
//! untrusted certificate it logs the failure and retries for ever, and a
//! role would sit silent with its backlog growing. The check turns the
//! first such failure into an error the binary reports (exit 2), and an
//! unreachable cluster into one after a bounded wait.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use thiserror::Error;

use crate::KafkaConfig;

/// Why a configuration cannot reach the cluster.
#[derive(Debug, Error)]
pub enum ConnectError {
    /// The settings themselves are wrong (an unknown property, a CA file
    /// that does not exist). Reject: fix the configuration.
    #[error("Kafka client settings rejected: {0}")]
    Settings(String),
    /// The brokers refused the credentials. Reject: fix the SASL settings.
    #[error("Kafka refused the credentials: {0}")]
    Authentication(String),
    /// The TLS handshake failed (untrusted CA, wrong host name, a plaintext
    /// listener). Reject: fix the TLS settings or the listener.
    #[error("TLS to Kafka failed: {0}")]
    Tls(String),
    /// No broker answered in time. Retry later: the cluster may be down.
    #[error("no Kafka broker of {brokers} answered within {waited:?}{}", last.as_deref().map(|e| format!(" (last error: {e})")).unwrap_or_default())]
    Unreachable { brokers: String, waited: Duration, last: Option<String> },
}

impl ConnectError {
    /// True when retrying with the same configuration cannot help.
    pub fn is_configuration(&self) -> bool {
        !matches!(self, ConnectError::Unreachable { .. })
    }
}

/// Collects what the client reports while the check runs.
#[derive(Default)]
struct Observed {
    refused: Mutex<Option<ConnectError>>,
    last: Mutex<Option<String>>,
}

impl ClientContext for Observed {
    fn error(&self, error: KafkaError, reason: &str) {
        let refused = match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed) => {
                Some(ConnectError::Authentication(reason.to_owned()))
            }
            Some(RDKafkaErrorCode::SSL) => Some(ConnectError::Tls(reason.to_owned())),
            // The same handshake failure also arrives as a transport failure,
            // sometimes first: its text says what it was.
            Some(RDKafkaErrorCode::BrokerTransportFailure) if reason.contains("SSL") => Some(ConnectError::Tls(reason.to_owned())),
            _ => None,
        };
        match refused {
            Some(refused) => {
                if let Ok(mut slot) = self.refused.lock() {
                    slot.get_or_insert(refused);
                }
            }
            None => {
                if let Ok(mut slot) = self.last.lock() {
                    *slot = Some(reason.to_owned());
                }
            }
        }
    }
}

/// The check produces nothing; a producer is only the cheapest client that
/// serves error events on `poll`.
impl ProducerContext for Observed {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// Connects with `kafka`'s settings and returns once a broker answered a
/// metadata request, or with the first refusal, or after `within`.
pub async fn check_connection(kafka: &KafkaConfig, within: Duration) -> Result<(), ConnectError> {
    let kafka = kafka.clone();
    tokio::task::spawn_blocking(move || check_blocking(&kafka, within))
        .await
        .map_err(|e| ConnectError::Settings(format!("the connection check did not finish: {e}")))?
}

fn check_blocking(kafka: &KafkaConfig, within: Duration) -> Result<(), ConnectError> {
    let producer: BaseProducer<Observed> =
        kafka.admin().create_with_context(Observed::default()).map_err(|e| ConnectError::Settings(e.to_string()))?;
    let started = Instant::now();
    loop {
        // Short attempts so a refusal reported meanwhile ends the check early.
        if producer.client().fetch_metadata(None, Duration::from_millis(500)).is_ok() {
            return Ok(());
        }
        // Serves the error events the attempt queued into `Observed`: one
        // `poll` call serves events until its deadline, at most one if it
        // has none, so give it a moment.
        producer.poll(Duration::from_millis(200));
        let context = producer.context();
        if let Some(refused) = context.refused.lock().ok().and_then(|mut slot| slot.take()) {
            return Err(refused);
        }
        if started.elapsed() >= within {
            let last = context.last.lock().ok().and_then(|mut slot| slot.take());
            return Err(ConnectError::Unreachable { brokers: kafka.brokers().to_owned(), waited: within, last });
        }
    }
}
