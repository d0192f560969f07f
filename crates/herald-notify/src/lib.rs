//! Notifications of finished exports. This milestone has the first half: the
//! `notify` subscription turns each completion into one notification intent
//! per recipient, with a stable idempotency key. The dispatcher that claims
//! intents and calls the provider comes later (issue 6).
//!
//! - [`intents`]: the handler and the intent table.
//!
//! Nothing that rebuilds projections may depend on this crate: replaying
//! history must never reach a notification path.

pub mod intents;
