//! Notifications of finished exports — the one effect Herald cannot take back.
//!
//! - [`intents`]: the `notify` subscription's handler: one intent per
//!   (event, recipient) with a stable idempotency key.
//! - [`rules`]: what an attempt's outcome means for the intent, the provider's
//!   status classes, key retention (no IO).
//! - [`provider`]: the HTTP client and the provider's capabilities.
//! - [`claims`]: owner/token/lease claims on the database's clock; a
//!   conditional renew before every call; final writes check the token.
//! - [`dispatcher`]: claims due intents, calls the provider, records evidence.
//! - [`reconcile`]: asks a queryable provider, records an operator's decision
//!   or redrive.
//! - [`start`]: where the notify subscription starts when its group has no
//!   position; it refuses to start from history unless told where.
//!
//! Deduplicated: the provider effect, by the intent's idempotency key, at a
//! provider that honours it and only while it retains the key. Open window:
//! a provider without keys may execute an interrupted attempt's request; such
//! intents become `unknown` and are never resent without an operator.
//!
//! Nothing that rebuilds projections may depend on this crate: replaying
//! history must never reach a notification path.

pub mod claims;
pub mod dispatcher;
pub mod intents;
pub mod provider;
pub mod reconcile;
pub mod rules;
pub mod start;
pub mod templates;
