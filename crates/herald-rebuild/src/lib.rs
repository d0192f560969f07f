//! Rebuilding a projection into a new generation without side effects: the
//! orchestration. Replaying, deduplicating and writing are the projection
//! engine's (`herald_consumer::replay`, `herald_consumer::Projection`).
//!
//! - [`generations`]: opening a generation with its boundary, states,
//!   verification records, the switch and rollback transactions.
//! - [`verify`]: a new generation against the active one (one snapshot), or
//!   against the projection's own source of truth (offline).
//! - [`history`]: the first offset each generation needs per partition, and
//!   the gaps retention left.
//! - [`snapshot`]: the active search generation's documents with the
//!   positions they are consistent with, checksummed, to rebuild across a gap.
//! - [`rebuild`]: the whole procedure — plan, open (or resume), replay,
//!   verify, switch.
//!
//! Why a new generation agrees with the active one the moment its replay
//! ends: it owns records by offset. Below its boundary they are the
//! replay's, at or above it live traffic's, and the boundary is set from the
//! live subscription's applied positions under a lock (`herald_store::positions`).
//!
//! This crate has no notification dependency and accepts only
//! [`Projection`]s, a trait notification code does not implement: replaying
//! history cannot notify anyone, by construction.

pub mod generations;
pub mod history;
pub mod rebuild;
pub mod snapshot;
pub mod verify;

mod error;

pub use error::RebuildError;
pub use herald_consumer::replay;
pub use herald_consumer::{Fingerprint, Projection};
pub use herald_projections::search::Search;
pub use herald_projections::stats::Stats;
pub use rebuild::{Progress, RebuildOptions, RebuildReport, SwitchMode};
