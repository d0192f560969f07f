//! What a subscription does with the events it has not applied before.

use std::future::Future;

use herald_envelope::DecodedEvent;
use herald_store::Tx;
use sqlx::PgConnection;

use crate::{HandlerError, Order};

/// One event to apply, with where it was read: generation-aware handlers
/// (see [`crate::projection`]) decide by its offset which generations own it.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    pub event: &'a DecodedEvent,
    pub partition: i32,
    pub offset: i64,
}

/// A projection or effect driven by events. `apply` runs inside the
/// transaction that also records the inbox rows, and only with events the
/// subscription has not applied before — each at most once per batch.
pub trait Handler: Send + Sync {
    /// Event types this handler applies; others are skipped (and counted).
    fn handles(&self, event_type: &str) -> bool;

    /// Whether it needs a key's events in offset order even past a dead
    /// letter ([`Order::PerKey`]: later records of the key are parked behind
    /// it). The subscription's default; `SubscriptionOptions::order` overrides it.
    fn order(&self) -> Order {
        Order::None
    }

    /// Applies a batch of records (of a lane's partitions, in offset order
    /// per partition); set-based SQL for throughput. An error rolls the
    /// whole batch back and the runtime retries its records one by one to
    /// find the culprit.
    fn apply(&self, tx: &mut Tx<'_>, records: &[Record<'_>]) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// Whether [`Handler::apply_pg`] is implemented. On PostgreSQL, a batch
    /// with nothing undecodable, of a subscription without per-key order,
    /// then runs on sqlx's native driver with array binds: positions, inbox
    /// rows and this write in a few statements whatever the batch's size
    /// (`Any` binds every value of a multi-row `VALUES` one by one). Other
    /// batches, and records retried one by one, take [`Handler::apply`].
    fn applies_pg(&self) -> bool {
        false
    }

    /// The same as [`Handler::apply`] on a native PostgreSQL connection.
    fn apply_pg(&self, tx: &mut PgConnection, records: &[Record<'_>]) -> impl Future<Output = Result<(), HandlerError>> + Send {
        let _ = (tx, records);
        async { Err(HandlerError::Reject("this handler has no PostgreSQL fast path".into())) }
    }
}
