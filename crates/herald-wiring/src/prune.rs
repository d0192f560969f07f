//! `herald prune` and its schedule in `serve`: rows that have done their job
//! go once older than a retention, kind by kind, in small batches that each
//! commit at once, resting between batches so the relay and the consumers
//! keep the database (BENCHMARKS.md, "Prune").
//!
//! Every kind's horizon is raised before its first row goes, so an audit or
//! a rebuild that reads the database during or after a prune knows how far
//! down rows may be missing. Which retention is safe is
//! [`crate::retention`]'s business: the caller checks it first.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use herald_store::Db;
use herald_store::prune::{self, Batch, Kind};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// What to prune and how gently.
#[derive(Debug, Clone)]
pub struct PruneOptions {
    /// Rows older than this go.
    pub retention: Duration,
    pub kinds: Vec<Kind>,
    /// Rows per batch (per outbox window).
    pub batch: i64,
    /// Time spent resting per unit of time spent deleting: 2.0 keeps the
    /// prune to about a third of one connection's time (BENCHMARKS.md,
    /// "Prune": at 1.0 the search subscription kept 0.78 of its rate).
    pub idle_ratio: f64,
    /// Inbox rows of this subscription only (`herald inbox cleanup
    /// --subscription`); every subscription's when `None`.
    pub inbox_of: Option<String>,
}

impl Default for PruneOptions {
    fn default() -> Self {
        PruneOptions {
            retention: Duration::from_secs(30 * 86_400),
            kinds: Kind::ALL.to_vec(),
            batch: 1000,
            idle_ratio: 2.0,
            inbox_of: None,
        }
    }
}

/// What a prune removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    /// The horizon every kind was raised to: the database's clock minus the
    /// retention.
    pub horizon_ms: i64,
    pub removed: BTreeMap<Kind, u64>,
    /// Stopped by shutdown before every kind was done.
    pub interrupted: bool,
}

/// One pass over every kind asked for.
pub async fn prune(db: &Db, options: &PruneOptions, shutdown: &CancellationToken) -> Result<Pruned, herald_store::StoreError> {
    let retention_ms = i64::try_from(options.retention.as_millis()).unwrap_or(i64::MAX);
    let horizon_ms = prune::db_now_ms(db).await?.saturating_sub(retention_ms);
    let mut pruned = Pruned { horizon_ms, ..Pruned::default() };
    for kind in &options.kinds {
        prune::raise(db, *kind, horizon_ms).await?;
        let (removed, finished) = prune_kind(db, *kind, horizon_ms, options, shutdown).await?;
        prune::count_removed(db, *kind, removed).await?;
        info!(kind = kind.as_str(), removed, horizon_ms, "pruned");
        pruned.removed.insert(*kind, removed);
        if !finished {
            pruned.interrupted = true;
            break;
        }
    }
    Ok(pruned)
}

/// Batches of one kind until none is left or shutdown; `false`: interrupted.
async fn prune_kind(
    db: &Db,
    kind: Kind,
    before_ms: i64,
    options: &PruneOptions,
    shutdown: &CancellationToken,
) -> Result<(u64, bool), herald_store::StoreError> {
    let mut removed = 0;
    let mut next = Some(0);
    while let Some(at) = next {
        if shutdown.is_cancelled() {
            return Ok((removed, false));
        }
        let started = Instant::now();
        let batch = one_batch(db, kind, before_ms, at, options).await?;
        removed += batch.removed;
        next = batch.next;
        let rest = started.elapsed().mul_f64(options.idle_ratio.max(0.0));
        tokio::select! {
            () = tokio::time::sleep(rest) => {}
            () = shutdown.cancelled() => return Ok((removed, false)),
        }
    }
    Ok((removed, true))
}

async fn one_batch(db: &Db, kind: Kind, before_ms: i64, at: i64, options: &PruneOptions) -> Result<Batch, herald_store::StoreError> {
    let limit = options.batch;
    match kind {
        Kind::Outbox => prune::outbox(db, before_ms, at, limit).await,
        Kind::Inbox => prune::inbox(db, before_ms, options.inbox_of.as_deref(), limit).await,
        Kind::Intents => herald_notify::intents::prune(db, before_ms, limit).await,
        Kind::DeadLetters => prune::dead_letters(db, before_ms, limit).await,
        Kind::Tombstones => herald_projections::search::prune_tombstones(db, before_ms, limit).await,
        Kind::IntakeKeys => herald_export::jobs::prune_intake_keys(db, before_ms, limit).await,
    }
}

/// A prune on `serve`'s schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub options: PruneOptions,
    pub every: Duration,
}

/// `serve`'s schedule: a prune every `every`, until shutdown. A failed pass
/// is logged and tried again next time: nothing half-done needs repair
/// (each batch committed on its own, the horizons were raised first).
pub async fn run_every(db: Db, options: PruneOptions, every: Duration, shutdown: CancellationToken) {
    loop {
        match prune(&db, &options, &shutdown).await {
            Ok(pruned) => info!(horizon_ms = pruned.horizon_ms, removed = ?pruned.removed, "prune pass done"),
            Err(e) => warn!(error = %e, "prune pass failed; trying again next interval"),
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = shutdown.cancelled() => return,
        }
    }
}
