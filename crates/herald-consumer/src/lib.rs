//! The subscription runtime: one Kafka consumer group per subscription, the
//! effects of a batch of records committed in the database before their
//! offsets are stored and committed.
//!
//! - [`subscription`]: the batching runtime for inbox-deduplicated
//!   [`Handler`]s — collect a batch, one transaction for inbox rows and
//!   effects, store offsets after; rebalance and shutdown finish the batch in
//!   flight first ([`context`]).
//! - `batch` (private): one batch's transaction; permanent failures are
//!   isolated record by record and dead-lettered after bounded retries;
//!   retryable failures pause and retry, never dead-letter.
//! - `parking` (private): per-key order ([`Order`]) past a dead letter —
//!   a key's later records parked behind it, released by its redrive or
//!   discard.
//! - [`projection`]: read models in generations ([`Projection`]) and their
//!   live source ([`Live`]), a [`Handler`] that writes each record to the
//!   generations owning its offset.
//! - [`replay`]: the other source — retained history into one generation,
//!   up to its boundary (its write: `replay_write`).
//! - [`redrive`]: dead letters back through the same inbox and handler, or
//!   the same [`Processor`]; or discarded. Either releases the key's parked
//!   records.
//! - [`runtime`]: the one-record-at-a-time loop of non-inbox [`Processor`]s
//!   (the export worker, whose dedup is the job's state); permanent failures
//!   are dead-lettered like a subscription's, retryable ones pause.
//! - `letters` (private): the dead letter both runtimes write.
//!
//! Dedup window: a crash after the database commit and before the offset
//! commit redelivers the batch; its inbox rows make the second delivery a
//! no-op. That is the duplicate delivery this design admits, and the inbox
//! absorbs it for as long as the inbox rows are retained.

pub mod context;
pub mod handler;
pub mod metrics;
pub mod projection;
pub mod redrive;
pub mod replay;
pub mod runtime;
pub mod subscription;

mod batch;
mod error;
mod letters;
mod order;
mod parking;
mod replay_write;

pub use error::{HandlerError, ProcessError, ReplayError, RunError};
pub use handler::{Handler, Record, WritePath};
pub use metrics::{Metrics, MetricsSnapshot, StageTimes};
pub use order::{Order, UnknownOrder};
pub use parking::Released;
pub use projection::{Arrived, Fingerprint, Live, Projection};
pub use redrive::{Discarded, RedriveOutcome, Redriven, discard, redrive, redrive_processor, redrive_releasing, redrive_with};
pub use runtime::{Processed, Processor, Subscription, run};
pub use subscription::{SubscriptionOptions, run_subscription};
