//! The search projection: one document per succeeded export, in generations.
//! Reads always go through the generation named active in
//! `active_generations`, so a rebuild can fill another one beside it.

use std::collections::BTreeMap;

use herald_consumer::{Handler, HandlerError};
use herald_envelope::{DecodedEvent, EventData, ExportCompleted};
use herald_store::{Db, StoreError, Tx};
use serde::Serialize;
use sqlx::Row;

/// Subscription name, and so consumer group `herald.search`.
pub const SUBSCRIPTION: &str = "search";
const PROJECTION: &str = "search";

/// Applies `herald.export.completed` to the active generation.
#[derive(Debug, Clone, Default)]
pub struct SearchHandler;

impl Handler for SearchHandler {
    fn handles(&self, event_type: &str) -> bool {
        event_type == ExportCompleted::EVENT_TYPE
    }

    async fn apply(&self, tx: &mut Tx<'_>, event: &DecodedEvent) -> Result<(), HandlerError> {
        let data: ExportCompleted = event.data_as()?;
        upsert(tx, &data).await?;
        Ok(())
    }

    async fn apply_batch(&self, tx: &mut Tx<'_>, events: &[&DecodedEvent]) -> Result<(), HandlerError> {
        // One document per job: the newest business version in the batch
        // (one statement may not touch the same row twice on PostgreSQL).
        let mut newest: BTreeMap<String, ExportCompleted> = BTreeMap::new();
        for event in events {
            let data: ExportCompleted = event.data_as()?;
            match newest.get(&data.job_id) {
                Some(seen) if seen.version >= data.version => {}
                _ => {
                    newest.insert(data.job_id.clone(), data);
                }
            }
        }
        let docs: Vec<&ExportCompleted> = newest.values().collect();
        upsert_many(tx, &docs).await?;
        Ok(())
    }
}

/// [`upsert`] for many documents, a few statements instead of one per row.
async fn upsert_many(tx: &mut Tx<'_>, docs: &[&ExportCompleted]) -> Result<(), StoreError> {
    if docs.is_empty() {
        return Ok(());
    }
    let generation: i64 = sqlx::query("SELECT generation FROM active_generations WHERE projection = $1")
        .bind(PROJECTION)
        .fetch_one(&mut **tx)
        .await?
        .try_get("generation")?;
    for chunk in herald_store::outbox::statement_chunks(&docs) {
        let values: Vec<String> =
            (0..chunk.len()).map(|i| format!("({})", herald_store::outbox::placeholders(i * 9 + 1, 9))).collect();
        let sql = format!(
            "INSERT INTO search_documents (generation, job_id, caller, format, query, result_id, \
             size_bytes, completed_at_ms, version) VALUES {} \
             ON CONFLICT (generation, job_id) DO UPDATE SET caller = excluded.caller, \
             format = excluded.format, query = excluded.query, result_id = excluded.result_id, \
             size_bytes = excluded.size_bytes, completed_at_ms = excluded.completed_at_ms, \
             version = excluded.version WHERE search_documents.version < excluded.version",
            values.join(", ")
        );
        let mut query = sqlx::query(&sql);
        for doc in chunk {
            query = query
                .bind(generation)
                .bind(&doc.job_id)
                .bind(&doc.caller)
                .bind(&doc.format)
                .bind(&doc.query)
                .bind(&doc.result_id)
                .bind(doc.size_bytes)
                .bind(doc.completed_at_ms)
                .bind(doc.version);
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}

/// Writes the document unless the generation already holds a newer business
/// version of the same job (facts may arrive out of order across partitions
/// or replays; the version decides, not arrival).
async fn upsert(tx: &mut Tx<'_>, doc: &ExportCompleted) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO search_documents (generation, job_id, caller, format, query, result_id, \
         size_bytes, completed_at_ms, version) \
         SELECT generation, $1, $2, $3, $4, $5, $6, $7, $8 FROM active_generations WHERE projection = $9 \
         ON CONFLICT (generation, job_id) DO UPDATE SET caller = excluded.caller, \
         format = excluded.format, query = excluded.query, result_id = excluded.result_id, \
         size_bytes = excluded.size_bytes, completed_at_ms = excluded.completed_at_ms, \
         version = excluded.version WHERE search_documents.version < excluded.version",
    )
    .bind(&doc.job_id)
    .bind(&doc.caller)
    .bind(&doc.format)
    .bind(&doc.query)
    .bind(&doc.result_id)
    .bind(doc.size_bytes)
    .bind(doc.completed_at_ms)
    .bind(doc.version)
    .bind(PROJECTION)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SearchHit {
    pub job_id: String,
    pub format: String,
    pub query: String,
    pub result_id: String,
    pub size_bytes: i64,
    pub completed_at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SearchResults {
    pub generation: i64,
    pub hits: Vec<SearchHit>,
}

/// The caller's finished exports whose query contains `text` (case
/// insensitive), newest first, from the active generation.
pub async fn search(db: &Db, caller: &str, text: &str, limit: i64) -> Result<SearchResults, StoreError> {
    let mut tx = db.begin().await?;
    let generation: i64 = sqlx::query("SELECT generation FROM active_generations WHERE projection = $1")
        .bind(PROJECTION)
        .fetch_one(&mut *tx)
        .await?
        .try_get("generation")?;
    let pattern = format!("%{}%", escape_like(&text.to_lowercase()));
    let rows = sqlx::query(
        "SELECT job_id, format, query, result_id, size_bytes, completed_at_ms FROM search_documents \
         WHERE generation = $1 AND caller = $2 AND lower(query) LIKE $3 ESCAPE '\\' \
         ORDER BY completed_at_ms DESC, job_id LIMIT $4",
    )
    .bind(generation)
    .bind(caller)
    .bind(pattern)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let hits = rows
        .iter()
        .map(|r| {
            Ok(SearchHit {
                job_id: r.try_get("job_id")?,
                format: r.try_get("format")?,
                query: r.try_get("query")?,
                result_id: r.try_get("result_id")?,
                size_bytes: r.try_get("size_bytes")?,
                completed_at_ms: r.try_get("completed_at_ms")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
    Ok(SearchResults { generation, hits })
}

/// Documents in the active generation, for reports and audits.
pub async fn count_active(db: &Db) -> Result<i64, StoreError> {
    let row = sqlx::query(
        "SELECT COUNT(*) AS n FROM search_documents d JOIN active_generations g \
         ON g.projection = $1 AND d.generation = g.generation",
    )
    .bind(PROJECTION)
    .fetch_one(db.pool())
    .await?;
    Ok(row.try_get("n")?)
}

fn escape_like(text: &str) -> String {
    text.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_")
}
