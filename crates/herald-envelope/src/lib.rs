//! Herald's event envelope: what a fact looks like on the wire. No IO.
//!
//! - [`schema`]: the Avro schemas of event data, embedded from `schemas/`,
//!   and the [`schema::Registry`] a process reads with.
//! - [`compat`]: the evolution rules `herald schemas check` enforces.
//! - [`data`]: typed event data and its Avro binary codec.
//! - [`event`]: an outbox row's event, its CloudEvents form and Kafka record
//!   in binary content mode (`ce_*` headers).
//! - [`record`]: the same record's headers written directly, as the relay sends them.
//! - [`decode`]: the reverse way, validating every attribute Herald relies on.
//! - [`trace`]: W3C trace context carried as the CloudEvents
//!   distributed-tracing extension.
//! - [`legacy`]: the older JSON envelope, normalised to the same identity;
//!   [`decode_any`] reads either envelope.
//!
//! The dedup key of a fact is CloudEvents (`source`, `id`) — [`EventKey`] — and
//! nothing else: not the Kafka offset, not the payload bytes.

pub mod compat;
pub mod data;
pub mod decode;
pub mod event;
pub mod legacy;
pub mod pattern;
pub mod record;
pub mod schema;
pub mod trace;
pub mod trust;

mod binary;
mod error;

pub use data::{EventData, ExportCompleted, ExportCompletedV1, ExportDeleted, ExportFailed, ExportRequested, OutOfRange};
pub use decode::{DecodedEvent, decode_record, decode_record_with};
pub use error::EnvelopeError;
pub use event::{AVRO_CONTENT_TYPE, EventKey, JSON_CONTENT_TYPE, OutboxEvent, SOURCE_EXPORTS};
pub use legacy::{decode_any, decode_any_with};
pub use schema::Registry;
pub use trace::TraceContext;
pub use trust::Sources;
