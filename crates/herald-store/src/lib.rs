//! sqlx adapters shared by every Herald role: the database handle, the outbox,
//! the inbox and the dead-letter store. Domain crates keep their own tables' SQL next to their
//! domain, on top of [`Db`].
//!
//! One code path serves PostgreSQL (production) and SQLite (the embedded
//! default) through sqlx's `Any` driver: SQL is written in the subset both
//! accept (`$n` placeholders, `ON CONFLICT`, `RETURNING`), times are epoch
//! milliseconds, and the few statements that must differ branch on
//! [`Backend`].

pub mod appended;
mod db;
pub mod dead_letter;
pub mod delivered;
mod error;
pub mod generations;
pub mod inbox;
pub mod lease;
pub mod outbox;
pub mod parked;
pub mod positions;
pub mod prune;
pub mod schema;
pub mod start_positions;

pub use db::{Backend, Db, PLAN_ONCE, now_ms};
pub use error::StoreError;

/// Re-exported so adapters in other crates name one transaction type.
pub type Tx<'c> = sqlx::Transaction<'c, sqlx::Any>;
