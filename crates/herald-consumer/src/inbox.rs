use std::future::Future;

use herald_envelope::{DecodedEvent, decode_record};
use herald_store::inbox::{self, Delivery};
use herald_store::{Db, Tx};
use rdkafka::message::{BorrowedMessage, Message};
use tracing::debug;

use crate::{HandlerError, ProcessError, Processor};

/// A projection or effect driven by events. `apply` runs inside the
/// transaction that also records the inbox row, and only for events the
/// subscription has not applied before.
pub trait Handler: Send + Sync {
    /// Event types this handler applies; others are skipped.
    fn handles(&self, event_type: &str) -> bool;

    fn apply(
        &self,
        tx: &mut Tx<'_>,
        event: &DecodedEvent,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// Runs a [`Handler`] behind the subscription's inbox.
pub struct InboxProcessor<H> {
    db: Db,
    subscription: String,
    handler: H,
}

impl<H: Handler> InboxProcessor<H> {
    pub fn new(db: Db, subscription: impl Into<String>, handler: H) -> Self {
        InboxProcessor { db, subscription: subscription.into(), handler }
    }

    async fn apply_once(&self, event: &DecodedEvent, delivery: &Delivery<'_>) -> Result<bool, HandlerError> {
        let mut tx = self.db.begin().await?;
        let first = inbox::claim(&mut tx, &self.subscription, &event.key, &event.event_type, delivery).await?;
        if first {
            self.handler.apply(&mut tx, event).await?;
        }
        tx.commit().await.map_err(herald_store::StoreError::from)?;
        Ok(first)
    }
}

impl<H: Handler> Processor for InboxProcessor<H> {
    async fn process(&self, msg: &BorrowedMessage<'_>) -> Result<(), ProcessError> {
        let event = decode_record(msg).map_err(|e| ProcessError::Permanent(e.to_string()))?;
        if !self.handler.handles(&event.event_type) {
            debug!(subscription = %self.subscription, event_type = %event.event_type, "event type not handled; skipped");
            return Ok(());
        }
        let delivery = Delivery { topic: msg.topic(), partition: msg.partition(), offset: msg.offset() };
        let first = self.apply_once(&event, &delivery).await?;
        if !first {
            debug!(subscription = %self.subscription, id = %event.key.id, "duplicate delivery absorbed by inbox");
        }
        Ok(())
    }
}
