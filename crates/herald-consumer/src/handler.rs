//! What a subscription does with the events it has not applied before.

use std::future::Future;

use herald_envelope::DecodedEvent;
use herald_store::Tx;

use crate::HandlerError;

/// A projection or effect driven by events. `apply_batch` runs inside the
/// transaction that also records the inbox rows, and only with events the
/// subscription has not applied before — each at most once per batch.
pub trait Handler: Send + Sync {
    /// Event types this handler applies; others are skipped (and counted).
    fn handles(&self, event_type: &str) -> bool;

    /// Applies one event.
    fn apply(
        &self,
        tx: &mut Tx<'_>,
        event: &DecodedEvent,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// Applies many events in one go; handlers override it with set-based
    /// SQL for throughput. An error rolls the whole batch back and the
    /// runtime retries its events one by one to find the culprit.
    fn apply_batch(
        &self,
        tx: &mut Tx<'_>,
        events: &[&DecodedEvent],
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        async move {
            for event in events {
                self.apply(tx, event).await?;
            }
            Ok(())
        }
    }
}
