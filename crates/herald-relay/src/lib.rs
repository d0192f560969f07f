//! The relay: committed outbox rows → Kafka, as CloudEvents in binary mode.
//!
//! The order of operations is the whole point: claim a slice of the key
//! space, read its committed rows forward, publish them, wait for the
//! broker's acknowledgement of each (idempotent producer, `acks=all`), and
//! only then record progress — in one transaction that first checks the
//! claim's token, so a relay whose lease expired writes nothing. A crash
//! between the ack and the progress write republishes the rows with the same
//! CloudEvents ids: at-least-once toward Kafka, deduplicated downstream by
//! each subscription's inbox. Marking before publishing would turn that
//! window into silent loss, so it is never done.
//!
//! - `relay`: the process — membership, claims, lease renewal, rebalancing.
//! - `slice`: one claimed slice — read, publish, settle, record (fenced),
//!   with up to `in_flight` batches out; `settle`: verdicts → progress.
//! - `publish`: the producer and its settings; `error`: what failed and how
//!   it is handled (retryable or permanent).
//! - `wake`: PostgreSQL LISTEN/NOTIFY. Fault injection: `RelayConfig::faults`
//!   (a [`herald_fault::Hook`]) at `before-progress`.
//! - [`claims`]: the relay's tables — slice claims (on the store's lease
//!   primitive), membership, the fenced progress write; `cursor`: where a
//!   slice's reading stands and the read forward from it.

pub mod claims;
mod config;
mod counters;
mod cursor;
mod error;
mod publish;
mod relay;
mod routes;
mod settle;
mod slice;
mod wake;

pub use config::RelayConfig;
pub use counters::RelayCounters;
pub use error::{Class, PublishError, RelayError, classify};
pub use publish::{check_producer_settings, producer_config};
pub use relay::Relay;
pub use routes::{RouteError, Routes};
