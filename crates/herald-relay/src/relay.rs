use std::time::Duration;

use cloudevents::binding::rdkafka::FutureRecordExt;
use futures::future::join_all;
use herald_store::{Db, outbox};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::RelayError;

#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Rows read and published per pass.
    pub batch_size: i64,
    /// Wait after a pass that found nothing to publish.
    pub idle_wait: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig { batch_size: 500, idle_wait: Duration::from_millis(50) }
    }
}

pub struct Relay {
    db: Db,
    producer: FutureProducer,
    config: RelayConfig,
}

impl Relay {
    pub fn new(db: Db, brokers: &str, config: RelayConfig) -> Result<Relay, RelayError> {
        let producer = herald_kafka::producer_config(brokers)
            .create()
            .map_err(RelayError::Producer)?;
        Ok(Relay { db, producer, config })
    }

    /// Publishes until `shutdown`; a pass in flight finishes first, so no
    /// acknowledged row is left unmarked by a clean stop.
    pub async fn run(&self, shutdown: CancellationToken) {
        info!(batch = self.config.batch_size, "relay started");
        while !shutdown.is_cancelled() {
            let wait = match self.publish_once().await {
                Ok(0) => self.config.idle_wait,
                Ok(_) => Duration::ZERO,
                Err(e) => {
                    warn!(error = %e, "relay pass failed; retrying");
                    self.config.idle_wait * 10
                }
            };
            if !wait.is_zero() {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
        info!("relay stopped");
    }

    /// One pass: publish the oldest pending rows, mark those the broker
    /// acknowledged. Returns how many were delivered.
    pub async fn publish_once(&self) -> Result<usize, RelayError> {
        let rows = outbox::pending(&self.db, self.config.batch_size).await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let deliveries = rows.iter().map(|row| self.publish(row));
        let outcomes = join_all(deliveries).await;
        let mut delivered = Vec::with_capacity(rows.len());
        for (row, outcome) in rows.iter().zip(outcomes) {
            match outcome {
                Ok(()) => delivered.push(row.seq),
                Err(error) => {
                    warn!(seq = row.seq, event_id = %row.event.id, %error, "publish failed; row stays pending");
                    outbox::record_failure(&self.db, row.seq, &error).await?;
                }
            }
        }
        outbox::mark_delivered(&self.db, &delivered).await?;
        debug!(delivered = delivered.len(), "relay pass");
        Ok(delivered.len())
    }

    /// Sends one row and waits for the broker's verdict on it.
    async fn publish(&self, row: &outbox::OutboxRow) -> Result<(), String> {
        let message = row.event.to_kafka_record().map_err(|e| e.to_string())?;
        let record = FutureRecord::to(&row.event.topic)
            .key(row.event.partition_key.as_str())
            .message_record(&message);
        let delivery = self
            .producer
            .send_result(record)
            .map_err(|(e, _)| e.to_string())?;
        match delivery.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((e, _))) => Err(e.to_string()),
            Err(_) => Err("producer dropped the delivery report".to_owned()),
        }
    }
}
