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

/// How a native write ([`Handler::apply_pg`], `Projection::write_pg`) meets
/// rows already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WritePath {
    /// Plain inserts and no savepoint: what nearly every batch needs, at the
    /// least cost in statements and round trips. A row already there fails
    /// the statement, and with it the transaction: return
    /// [`HandlerError::Conflict`] ([`HandlerError::from_plain_write`]) and the
    /// engine applies the batch again in a new transaction with `Upsert`.
    Plain,
    /// Rows already there are resolved as the write's own rules say
    /// (`ON CONFLICT …`: a redelivery, a rewind, a replay meeting live traffic).
    Upsert,
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

    /// The same as [`Handler::apply`] on a native PostgreSQL connection,
    /// conflicts met as `path` says.
    fn apply_pg(
        &self,
        tx: &mut PgConnection,
        records: &[Record<'_>],
        path: WritePath,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        let _ = (tx, records, path);
        async { Err(HandlerError::Reject("this handler has no PostgreSQL fast path".into())) }
    }
}
