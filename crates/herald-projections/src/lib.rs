//! Read models built from export facts. Handlers here are replay-safe: they
//! write only their own tables, so replaying history into them (a rewind, a
//! rebuild) can never cause an effect outside the database.
//!
//! - [`search`]: searchable documents of finished exports, per generation.
//! - [`stats`]: counters of completed exports by day, caller and format.

pub mod search;
pub mod stats;
