//! Rebuilding a projection into a new generation without side effects.
//!
//! - [`generations`]: the generations table — states, positions, the switch
//!   and rollback transactions.
//! - [`replay`]: reads retained history with the generation's own read
//!   positions up to the recorded boundary, writing only that generation.
//! - [`verify`]: compares two generations in one snapshot.
//! - [`history`]: the first offset each generation needs per partition, and
//!   the gaps retention left.
//! - [`snapshot`]: the active generation's documents with the positions
//!   they are consistent with, checksummed, to rebuild across a gap.
//! - [`rebuild`]: the whole procedure — create (or resume), replay, wait for
//!   live traffic to pass the boundary, verify, switch.
//!
//! Why a new generation keeps up with live traffic: live subscriptions write
//! every generation in a live state (see `herald_projections::search`), and
//! document writes are idempotent and ordered by business version, so a
//! replay and live traffic can both write a generation in any order and
//! agree. The replay's own dedup scope is the inbox subscription
//! `search@g<N>`.
//!
//! This crate has no notification dependency and accepts only
//! [`Projection`]s, a trait notification code does not implement: replaying
//! history cannot notify anyone, by construction.

pub mod generations;
pub mod history;
pub mod rebuild;
pub mod replay;
pub mod snapshot;
pub mod verify;
mod write;

mod error;

pub use error::RebuildError;
pub use rebuild::{Progress, RebuildOptions, RebuildReport, SwitchMode};

/// A read model that can be rebuilt: it writes only its own tables, into one
/// generation, idempotently. Implemented for search; deliberately not for
/// anything that calls out of the database.
pub trait Projection: Send + Sync {
    /// Name in `projection_generations` and the prefix of its inbox scopes.
    const NAME: &'static str;
}

/// The search projection.
pub struct Search;

impl Projection for Search {
    const NAME: &'static str = "search";
}
