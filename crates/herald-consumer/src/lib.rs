//! The subscription runtime: one Kafka consumer group per subscription, each
//! record's effect committed in the database before its offset is committed.
//!
//! - [`runtime`]: the consume loop — receive, process, commit the offset
//!   after; retryable failures pause the partition's progress, never skip it.
//! - [`inbox`]: a [`Processor`] that deduplicates on CloudEvents
//!   (`source`, `id`) per subscription, inbox row and effect in one
//!   transaction, for handlers that implement [`Handler`].
//!
//! Dedup window: a crash after the database commit and before the offset
//! commit redelivers the record; the inbox row makes the second delivery a
//! no-op. That is the only duplicate this design admits, and it is absorbed.

pub mod inbox;
pub mod runtime;

mod error;

pub use error::{HandlerError, ProcessError};
pub use inbox::{Handler, InboxProcessor};
pub use runtime::{Processor, Subscription, run};
