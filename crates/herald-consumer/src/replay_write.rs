//! A replay's write: one transaction per batch with the dedup rows of the
//! replay's own scope (`<projection>@g<N>`, unless the projection's writes
//! are idempotent), the projection's write of the first-seen facts into
//! generation N only, and the batch's positions — so a rebuild killed at any
//! point resumes exactly after what it applied, each event once.
//!
//! Two paths, same statements in effect: sqlx's native PostgreSQL driver
//! with array binds when the projection has a fast path there
//! ([`Projection::WRITES_PG`]); the shared `Any` path otherwise.

use std::collections::{BTreeMap, HashSet};

use herald_envelope::EventKey;
use herald_store::inbox::{self, Delivery, Entry, PgEntry};
use herald_store::{Db, generations};
use sqlx::postgres::PgPool;

use crate::batch::admit_pg;
use crate::projection::{Arrived, Projection};
use crate::replay::{Content, Replayed};
use crate::{HandlerError, ReplayError, WritePath};

pub(crate) struct Writer<'p, P> {
    projection: &'p P,
    target: Target,
    generation: i64,
    scope: String,
    topic: String,
}

enum Target {
    Postgres(PgPool),
    Any(Db),
}

/// One fact of a batch with its record's place.
struct Item<'a, F> {
    key: &'a EventKey,
    event_type: &'a str,
    partition: i32,
    offset: i64,
    fact: &'a F,
}

impl<'p, P: Projection> Writer<'p, P> {
    pub async fn open(db: &Db, projection: &'p P, generation: i64, scope: &str, topic: &str) -> Result<Writer<'p, P>, ReplayError> {
        // One connection per lane, plus one spare.
        let native = if P::WRITES_PG { db.native_postgres(3)? } else { None };
        let target = native.map_or_else(|| Target::Any(db.clone()), Target::Postgres);
        Ok(Writer { projection, target, generation, scope: scope.to_owned(), topic: topic.to_owned() })
    }

    pub async fn close(&self) {
        if let Target::Postgres(pool) = &self.target {
            pool.close().await;
        }
    }

    /// Applies one batch in one transaction; returns the undecodable records
    /// it skipped.
    pub async fn apply(&self, batch: &[Replayed<P::Fact>]) -> Result<u64, ReplayError> {
        let skipped = batch.iter().filter(|r| matches!(r.content, Content::Undecodable)).count() as u64;
        let mut items: Vec<Item<'_, P::Fact>> = batch
            .iter()
            .filter_map(|r| match &r.content {
                Content::Fact { key, event_type, fact } => Some(Item { key, event_type, partition: r.partition, offset: r.offset, fact }),
                _ => None,
            })
            .collect();
        // Keys in one order in every transaction: no two can deadlock.
        items.sort_by(|a, b| a.key.cmp(b.key));
        let mut next: BTreeMap<i32, i64> = BTreeMap::new();
        for r in batch {
            let n = next.entry(r.partition).or_insert(0);
            *n = (*n).max(r.offset + 1);
        }
        match &self.target {
            Target::Postgres(pool) => self.apply_pg(pool, &items, &next).await?,
            Target::Any(db) => self.apply_any(db, &items, &next).await?,
        }
        Ok(skipped)
    }

    async fn apply_any(&self, db: &Db, items: &[Item<'_, P::Fact>], next: &BTreeMap<i32, i64>) -> Result<(), ReplayError> {
        let mut tx = db.begin().await?;
        let facts: Vec<&P::Fact> = if P::IDEMPOTENT {
            items.iter().map(|i| i.fact).collect()
        } else {
            let entries: Vec<Entry<'_>> = items
                .iter()
                .map(|i| Entry {
                    key: i.key,
                    event_type: i.event_type,
                    delivery: Delivery { topic: &self.topic, partition: i.partition, offset: i.offset },
                })
                .collect();
            let first: HashSet<EventKey> = inbox::admit_batch(&mut tx, &self.scope, &entries).await?;
            first_seen(items, |key| first.contains(key)).into_iter().map(|i| i.fact).collect()
        };
        if !facts.is_empty() {
            self.projection.write(&mut tx, self.generation, &facts).await?;
        }
        for (partition, next_offset) in next {
            generations::advance(&mut tx, P::NAME, self.generation, *partition, *next_offset).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Plain inserts first; only if a row was already there (a resumed
    /// replay, live traffic's document of the same job) the batch again in a
    /// new transaction, resolving what is there.
    async fn apply_pg(&self, pool: &PgPool, items: &[Item<'_, P::Fact>], next: &BTreeMap<i32, i64>) -> Result<(), ReplayError> {
        match self.apply_pg_on(pool, items, next, WritePath::Plain).await {
            Err(ReplayError::Projection(HandlerError::Conflict(_))) => self.apply_pg_on(pool, items, next, WritePath::Upsert).await,
            outcome => outcome,
        }
    }

    async fn apply_pg_on(
        &self,
        pool: &PgPool,
        items: &[Item<'_, P::Fact>],
        next: &BTreeMap<i32, i64>,
        path: WritePath,
    ) -> Result<(), ReplayError> {
        let mut tx = pool.begin().await?;
        let facts: Vec<Arrived<'_, P::Fact>> = if P::IDEMPOTENT {
            items.iter().map(Item::arrived).collect()
        } else {
            let entries: Vec<PgEntry<'_>> = items
                .iter()
                .map(|i| PgEntry { key: i.key, event_type: i.event_type, topic: &self.topic, partition: i.partition, offset: i.offset })
                .collect();
            let admitted = admit_pg(&mut tx, &self.scope, &entries, path).await?;
            first_seen(items, |key| admitted.admits(key)).into_iter().map(Item::arrived).collect()
        };
        if !facts.is_empty() {
            self.projection.load_pg(&mut tx, self.generation, &facts, path).await?;
        }
        generations::advance_pg(&mut tx, P::NAME, self.generation, next).await?;
        tx.commit().await?;
        Ok(())
    }
}

impl<'a, F> Item<'a, F> {
    fn arrived(&self) -> Arrived<'a, F> {
        Arrived { offset: self.offset, fact: self.fact }
    }
}

/// The facts of keys seen for the first time, once each (a batch can hold
/// both copies of an event the relay published twice).
fn first_seen<'i, 'a, F>(items: &'i [Item<'a, F>], is_first: impl Fn(&EventKey) -> bool) -> Vec<&'i Item<'a, F>> {
    let mut taken: HashSet<&EventKey> = HashSet::new();
    items.iter().filter(|i| is_first(i.key) && taken.insert(i.key)).collect()
}
