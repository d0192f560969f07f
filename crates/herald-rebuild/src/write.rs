//! The replay's write: one transaction per batch with the inbox rows of the
//! replay's own scope (`search@g<N>`), the documents of the first-seen facts
//! into generation N only, and the batch's positions — so a rebuild killed
//! at any point resumes exactly after what it applied, each event once.
//!
//! Two paths, same statements in effect:
//! - PostgreSQL: sqlx's native driver with array binds (`UNNEST`): three
//!   statements per batch whatever its size, no per-row parameters to bind
//!   and parse. Why a second path: the `Any` driver cannot bind arrays, and
//!   multi-row `VALUES` through it spends most of the replay's time in the
//!   client (see BENCHMARKS.md "Rebuild").
//! - anything else (SQLite): the shared `Any` path — `inbox::claim_batch`,
//!   `search::write`, `generations::advance`.

use std::collections::{BTreeMap, HashSet};

use herald_envelope::EventKey;
use herald_projections::search::{self, DocumentRow, Fact};
use herald_store::inbox::{self, Delivery, Entry};
use herald_store::{Backend, Db, StoreError, now_ms};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};

type PgTransaction<'c> = Transaction<'c, Postgres>;

use crate::RebuildError;
use crate::generations;
use crate::replay::{Content, Replayed};

pub struct Writer {
    target: Target,
    projection: String,
    generation: i64,
    scope: String,
    topic: String,
}

enum Target {
    Postgres(PgPool),
    Any(Db),
}

fn store(e: sqlx::Error) -> RebuildError {
    RebuildError::Store(StoreError::from(e))
}

impl Writer {
    pub async fn open(db: &Db, projection: &str, generation: i64, scope: &str, topic: &str) -> Result<Writer, RebuildError> {
        let target = match db.backend() {
            // One connection per lane, plus one spare.
            Backend::Postgres => Target::Postgres(PgPoolOptions::new().max_connections(3).connect(db.url()).await.map_err(store)?),
            Backend::Sqlite => Target::Any(db.clone()),
        };
        Ok(Writer { target, projection: projection.to_owned(), generation, scope: scope.to_owned(), topic: topic.to_owned() })
    }

    pub async fn close(&self) {
        if let Target::Postgres(pool) = &self.target {
            pool.close().await;
        }
    }

    /// Applies one batch in one transaction; returns the undecodable records
    /// it skipped.
    pub async fn apply(&self, batch: &[Replayed]) -> Result<u64, RebuildError> {
        let skipped = batch.iter().filter(|r| matches!(r.content, Content::Undecodable)).count() as u64;
        let mut facts: Vec<(&Replayed, &EventKey, &str, &Fact)> = batch
            .iter()
            .filter_map(|r| match &r.content {
                Content::Fact { key, event_type, fact } => Some((r, key, event_type.as_str(), fact.as_ref())),
                _ => None,
            })
            .collect();
        // Keys in one order in every transaction: no two can deadlock.
        facts.sort_by(|a, b| a.1.cmp(b.1));
        let mut next: BTreeMap<i32, i64> = BTreeMap::new();
        for r in batch {
            let n = next.entry(r.partition).or_insert(0);
            *n = (*n).max(r.offset + 1);
        }
        match &self.target {
            Target::Postgres(pool) => self.apply_pg(pool, &facts, &next).await?,
            Target::Any(db) => self.apply_any(db, &facts, &next).await?,
        }
        Ok(skipped)
    }

    async fn apply_any(&self, db: &Db, facts: &[(&Replayed, &EventKey, &str, &Fact)], next: &BTreeMap<i32, i64>) -> Result<(), RebuildError> {
        let mut tx = db.begin().await?;
        let entries: Vec<Entry<'_>> = facts
            .iter()
            .map(|(r, key, event_type, _)| Entry { key, event_type, delivery: Delivery { topic: &self.topic, partition: r.partition, offset: r.offset } })
            .collect();
        let first: HashSet<EventKey> = inbox::claim_batch(&mut tx, &self.scope, &entries).await?;
        let fresh = search::newest_per_job(facts.iter().filter(|(_, key, _, _)| first.contains(*key)).map(|(_, _, _, f)| (*f).clone()));
        search::write(&mut tx, self.generation, &fresh).await?;
        for (partition, next_offset) in next {
            generations::advance(&mut tx, &self.projection, self.generation, *partition, *next_offset).await?;
        }
        tx.commit().await.map_err(StoreError::from)?;
        Ok(())
    }

    async fn apply_pg(&self, pool: &PgPool, facts: &[(&Replayed, &EventKey, &str, &Fact)], next: &BTreeMap<i32, i64>) -> Result<(), RebuildError> {
        let mut tx = pool.begin().await.map_err(store)?;
        let first = self.claim_pg(&mut tx, facts).await?;
        let fresh = search::newest_per_job(
            facts.iter().filter(|(_, key, _, _)| first.contains(&(key.source.clone(), key.id.clone()))).map(|(_, _, _, f)| (*f).clone()),
        );
        let rows: Vec<DocumentRow> = fresh.iter().map(DocumentRow::from).collect();
        if !rows.is_empty() {
            self.write_pg(&mut tx, &rows).await?;
        }
        sqlx::query(
            "UPDATE generation_positions SET next_offset = u.n FROM UNNEST($1::int4[], $2::int8[]) AS u(p, n) \
             WHERE projection = $3 AND generation = $4 AND kafka_partition = u.p AND next_offset < u.n",
        )
        .bind(next.keys().copied().collect::<Vec<i32>>())
        .bind(next.values().copied().collect::<Vec<i64>>())
        .bind(&self.projection)
        .bind(self.generation)
        .execute(&mut *tx)
        .await
        .map_err(store)?;
        tx.commit().await.map_err(store)?;
        Ok(())
    }

    /// The batch's inbox rows, first as a plain insert behind a savepoint:
    /// a replay's scope is new, so conflicts are rare (a resumed batch, or
    /// live traffic that claimed first) and `ON CONFLICT` would make
    /// PostgreSQL look every key up twice (see `inbox::claim_batch`).
    async fn claim_pg(&self, tx: &mut PgTransaction<'_>, facts: &[(&Replayed, &EventKey, &str, &Fact)]) -> Result<HashSet<(String, String)>, RebuildError> {
        sqlx::query("SAVEPOINT replay_claim").execute(&mut **tx).await.map_err(store)?;
        match self.insert_inbox_pg(tx, facts, "").await {
            Ok(_) => return Ok(facts.iter().map(|f| (f.1.source.clone(), f.1.id.clone())).collect()),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                sqlx::query("ROLLBACK TO SAVEPOINT replay_claim").execute(&mut **tx).await.map_err(store)?;
            }
            Err(e) => return Err(store(e)),
        }
        let tail = " ON CONFLICT (subscription, source, event_id) DO NOTHING RETURNING source, event_id";
        Ok(self.insert_inbox_pg(tx, facts, tail).await.map_err(store)?.into_iter().collect())
    }

    async fn insert_inbox_pg(
        &self,
        tx: &mut PgTransaction<'_>,
        facts: &[(&Replayed, &EventKey, &str, &Fact)],
        tail: &str,
    ) -> Result<Vec<(String, String)>, sqlx::Error> {
        let sql = format!(
            "INSERT INTO inbox (subscription, source, event_id, event_type, topic, kafka_partition, kafka_offset, processed_at_ms) \
             SELECT $1, s, i, t, $2, p, o, $3 FROM UNNEST($4::text[], $5::text[], $6::text[], $7::int4[], $8::int8[]) AS u(s, i, t, p, o){tail}"
        );
        sqlx::query_as::<_, (String, String)>(&sql)
            .bind(&self.scope)
            .bind(&self.topic)
            .bind(now_ms())
            .bind(facts.iter().map(|f| f.1.source.as_str()).collect::<Vec<_>>())
            .bind(facts.iter().map(|f| f.1.id.as_str()).collect::<Vec<_>>())
            .bind(facts.iter().map(|f| f.2).collect::<Vec<_>>())
            .bind(facts.iter().map(|f| f.0.partition).collect::<Vec<_>>())
            .bind(facts.iter().map(|f| f.0.offset).collect::<Vec<_>>())
            .fetch_all(&mut **tx)
            .await
    }

    /// Documents into generation N: plain insert behind a savepoint, the
    /// version-guarded upsert only when a job already has a row there (live
    /// traffic writes every live generation, this one included).
    async fn write_pg(&self, tx: &mut PgTransaction<'_>, rows: &[DocumentRow]) -> Result<(), RebuildError> {
        sqlx::query("SAVEPOINT replay_write").execute(&mut **tx).await.map_err(store)?;
        match self.insert_documents_pg(tx, rows, "").await {
            Ok(()) => return Ok(()),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                sqlx::query("ROLLBACK TO SAVEPOINT replay_write").execute(&mut **tx).await.map_err(store)?;
            }
            Err(e) => return Err(store(e)),
        }
        let guard = " ON CONFLICT (generation, job_id) DO UPDATE SET caller = excluded.caller, format = excluded.format, \
             query = excluded.query, result_id = excluded.result_id, size_bytes = excluded.size_bytes, \
             completed_at_ms = excluded.completed_at_ms, version = excluded.version, deleted_at_ms = excluded.deleted_at_ms \
             WHERE search_documents.version < excluded.version";
        self.insert_documents_pg(tx, rows, guard).await.map_err(store)
    }

    async fn insert_documents_pg(&self, tx: &mut PgTransaction<'_>, rows: &[DocumentRow], tail: &str) -> Result<(), sqlx::Error> {
        let sql = format!(
            "INSERT INTO search_documents (generation, job_id, caller, format, query, result_id, size_bytes, completed_at_ms, \
             version, deleted_at_ms) \
             SELECT $1, * FROM UNNEST($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int8[], $8::int8[], \
             $9::int8[], $10::int8[]){tail}"
        );
        sqlx::query(&sql)
            .bind(self.generation)
            .bind(rows.iter().map(|r| r.job_id.as_str()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.caller.as_str()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.format.as_str()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.query.as_str()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.result_id.as_str()).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.size_bytes).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.completed_at_ms).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.version).collect::<Vec<_>>())
            .bind(rows.iter().map(|r| r.deleted_at_ms).collect::<Vec<_>>())
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use herald_envelope::{EventKey, ExportCompleted};
    use herald_projections::search::Fact;
    use herald_store::Db;
    use herald_testkit::{TestDb, postgres_db, sqlite_db};
    use sqlx::Row;

    use super::Writer;
    use crate::replay::{Content, Replayed};

    fn completed(job: &str, version: i64, id: &str, offset: i64) -> Replayed {
        let fact = Fact::Completed(ExportCompleted {
            job_id: job.into(),
            caller: "alice".into(),
            format: "csv".into(),
            query: format!("{job} v{version}"),
            result_id: "r".into(),
            size_bytes: 1,
            sha256: String::new(),
            completed_at_ms: 1,
            version,
            content_type: "text/csv".into(),
        });
        let key = EventKey { source: "/herald/exports".into(), id: id.into() };
        Replayed { partition: 0, offset, content: Content::Fact { key, event_type: "herald.export.completed".into(), fact: Box::new(fact) } }
    }

    async fn versions(db: &Db) -> anyhow::Result<Vec<(String, i64)>> {
        let rows = sqlx::query("SELECT job_id, version FROM search_documents WHERE generation = 7 ORDER BY job_id").fetch_all(db.pool()).await?;
        Ok(rows.iter().map(|r| Ok((r.try_get("job_id")?, r.try_get("version")?))).collect::<Result<_, sqlx::Error>>()?)
    }

    /// The second batch takes the conflict path on both statements: a key
    /// the scope already holds, an older version of a job already written,
    /// a newer one of another. Nothing is applied twice and no older
    /// version overwrites a newer one.
    async fn a_batch_meeting_earlier_writes_falls_back_and_keeps_versions(test_db: TestDb) -> anyhow::Result<()> {
        let db = Db::connect_and_migrate(&test_db.url).await?;
        let writer = Writer::open(&db, "search", 7, "search@g7", "export.events").await?;
        writer.apply(&[completed("a", 2, "e1", 0), completed("b", 1, "e2", 1)]).await?;
        assert_eq!(versions(&db).await?, [("a".to_owned(), 2), ("b".to_owned(), 1)]);

        writer.apply(&[completed("a", 2, "e1", 0), completed("a", 1, "e3", 2), completed("b", 3, "e4", 3)]).await?;
        assert_eq!(versions(&db).await?, [("a".to_owned(), 2), ("b".to_owned(), 3)]);
        let claimed: i64 = sqlx::query("SELECT COUNT(*) AS n FROM inbox WHERE subscription = 'search@g7'")
            .fetch_one(db.pool())
            .await?
            .try_get("n")?;
        assert_eq!(claimed, 4, "e1 once, e2, e3, e4");
        writer.close().await;
        Ok(())
    }

    #[tokio::test]
    async fn conflicts_fall_back_on_postgres() -> anyhow::Result<()> {
        a_batch_meeting_earlier_writes_falls_back_and_keeps_versions(postgres_db().await?).await
    }

    #[tokio::test]
    async fn conflicts_fall_back_on_sqlite() -> anyhow::Result<()> {
        a_batch_meeting_earlier_writes_falls_back_and_keeps_versions(sqlite_db()?).await
    }
}
