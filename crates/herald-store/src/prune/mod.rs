//! Prune horizons: how far down each kind of row may be missing because a
//! prune removed it. The audit checks only what is above a horizon, and a
//! rebuild's verification ignores tombstones below one, so a pruned row is
//! never reported as lost.
//!
//! Each kind is pruned by a time of its own, and every one of those times is
//! at or after the time of the event the row is about (a row is written
//! after its event happened): a row removed below horizon `H` is about an
//! event older than `H`. That one implication is what the audit relies on.

mod batches;

pub use batches::{Batch, dead_letters, inbox, outbox};

use sqlx::Row;

use crate::{Backend, Db, StoreError, Tx};

/// A kind of row a prune removes, and the column that dates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Delivered outbox rows, by `delivered_at_ms` where a release before
    /// v0.11.0 wrote it, else by `created_at_ms`.
    Outbox,
    /// Inbox rows, by `processed_at_ms`.
    Inbox,
    /// Settled notification intents (`sent`, `conflict`, `failed`, `dead`), by
    /// `updated_at_ms`.
    Intents,
    /// Redriven or discarded dead letters, by `updated_at_ms`.
    DeadLetters,
    /// Search tombstones, by `deleted_at_ms`.
    Tombstones,
    /// Intake keys (`export_intents`), by `created_at_ms`.
    IntakeKeys,
}

impl Kind {
    pub const ALL: [Kind; 6] = [Kind::Outbox, Kind::Inbox, Kind::Intents, Kind::DeadLetters, Kind::Tombstones, Kind::IntakeKeys];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Outbox => "outbox",
            Kind::Inbox => "inbox",
            Kind::Intents => "intents",
            Kind::DeadLetters => "dead_letters",
            Kind::Tombstones => "tombstones",
            Kind::IntakeKeys => "intake_keys",
        }
    }

    pub fn parse(text: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == text)
    }

    /// What the rows are, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Outbox => "delivered outbox rows",
            Kind::Inbox => "inbox rows",
            Kind::Intents => "settled notification intents",
            Kind::DeadLetters => "redriven or discarded dead letters",
            Kind::Tombstones => "search tombstones",
            Kind::IntakeKeys => "intake keys",
        }
    }
}

/// Every kind's horizon: rows dated below it may be gone. `None`: never pruned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Horizons([Option<i64>; Kind::ALL.len()]);

impl Horizons {
    pub fn get(&self, kind: Kind) -> Option<i64> {
        self.0[kind as usize]
    }

    /// Raises `kind`'s horizon to `horizon_ms` (never lowers it).
    pub fn set(&mut self, kind: Kind, horizon_ms: i64) {
        let slot = &mut self.0[kind as usize];
        *slot = Some(slot.map_or(horizon_ms, |h| h.max(horizon_ms)));
    }

    /// Whether a row of `kind` dated `at_ms` may have been pruned.
    pub fn below(&self, kind: Kind, at_ms: i64) -> bool {
        self.get(kind).is_some_and(|h| at_ms < h)
    }

    /// [`Horizons::below`] for a date that may be unknown: once `kind` was
    /// pruned at all, an undated row may have been among what went.
    pub fn may_be_pruned(&self, kind: Kind, at_ms: Option<i64>) -> bool {
        self.get(kind).is_some() && at_ms.is_none_or(|at| self.below(kind, at))
    }
}

/// The horizons as recorded, read inside `tx` (so they agree with the rows
/// the caller reads next to them).
pub async fn horizons(tx: &mut Tx<'_>) -> Result<Horizons, StoreError> {
    let mut horizons = Horizons::default();
    for row in sqlx::query("SELECT kind, horizon_ms FROM prune_horizons").fetch_all(&mut **tx).await? {
        let kind: String = row.try_get("kind")?;
        // A kind this release does not know was written by a newer one: its
        // rows are none of this release's checks' business.
        if let Some(kind) = Kind::parse(&kind) {
            horizons.set(kind, row.try_get("horizon_ms")?);
        }
    }
    Ok(horizons)
}

/// Raises `kind`'s horizon to `horizon_ms` (never lowers it), before any row
/// below it is removed.
pub async fn raise(db: &Db, kind: Kind, horizon_ms: i64) -> Result<(), StoreError> {
    let highest = match db.backend() {
        Backend::Postgres => "GREATEST(prune_horizons.horizon_ms, excluded.horizon_ms)",
        Backend::Sqlite => "MAX(prune_horizons.horizon_ms, excluded.horizon_ms)",
    };
    let sql = format!(
        "INSERT INTO prune_horizons (kind, horizon_ms, updated_at_ms) VALUES ($1, $2, {now}) \
         ON CONFLICT (kind) DO UPDATE SET horizon_ms = {highest}, updated_at_ms = excluded.updated_at_ms",
        now = db.now_sql()
    );
    sqlx::query(&sql).bind(kind.as_str()).bind(horizon_ms).execute(db.pool()).await?;
    Ok(())
}

/// Adds `removed` to `kind`'s tally of rows pruned.
pub async fn count_removed(db: &Db, kind: Kind, removed: u64) -> Result<(), StoreError> {
    sqlx::query("UPDATE prune_horizons SET removed = removed + $1 WHERE kind = $2")
        .bind(i64::try_from(removed).unwrap_or(i64::MAX))
        .bind(kind.as_str())
        .execute(db.pool())
        .await?;
    Ok(())
}

/// The database's clock, in epoch milliseconds: the rows' times are its, so a
/// cutoff is too.
pub async fn db_now_ms(db: &Db) -> Result<i64, StoreError> {
    let row = sqlx::query(&format!("SELECT {} AS now", db.now_sql())).fetch_one(db.pool()).await?;
    Ok(row.try_get("now")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_horizon_only_rises() {
        let mut h = Horizons::default();
        assert!(!h.below(Kind::Outbox, 0));
        h.set(Kind::Outbox, 100);
        h.set(Kind::Outbox, 50);
        assert_eq!(h.get(Kind::Outbox), Some(100));
        assert!(h.below(Kind::Outbox, 99) && !h.below(Kind::Outbox, 100));
        assert!(!h.below(Kind::Inbox, 0), "kinds are independent");
    }

    #[test]
    fn kinds_round_trip_through_their_names() {
        for kind in Kind::ALL {
            assert_eq!(Kind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(Kind::parse("jobs"), None);
    }
}
