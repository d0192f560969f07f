//! The relay: committed outbox rows → Kafka, as CloudEvents in binary mode.
//!
//! The order of operations is the whole point: read committed rows, publish,
//! wait for the broker's acknowledgement (idempotent producer, `acks=all`),
//! and only then mark the rows delivered. A crash between the ack and the mark
//! republishes the row with the same CloudEvents id — at-least-once toward
//! Kafka, deduplicated downstream by each subscription's inbox. Marking before
//! publishing would turn that window into silent loss, so it is never done.

mod error;
mod relay;

pub use error::RelayError;
pub use relay::{Relay, RelayConfig};
