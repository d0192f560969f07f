//! The search projection: one document per succeeded export, in generations.
//! Reads always go through the generation named active in
//! `active_generations`, so a rebuild can fill another one beside it.
//!
//! - `write`: the writers (the shared `Any` path, and the pieces of
//!   PostgreSQL's fast path).
//! - `load`: on PostgreSQL, which table a native write names, and a
//!   replay's generation loaded into a table of its own;
//! - `seal`: that table indexed, keyed and attached.
//! - `copy_text`: documents as `COPY` lines, how a replay loads them.
//! - `verify`: a generation's fingerprint, and its check against the jobs
//!   table (the projection's source of truth) for offline rebuilds.

use herald_consumer::{Arrived, Fingerprint, HandlerError, Projection, WritePath};
use herald_envelope::{DecodedEvent, EnvelopeError, EventData, ExportCompleted, ExportDeleted};
use herald_store::delivered::Settled;
use herald_store::{Backend, Db, StoreError, Tx};
use serde::Serialize;
use sqlx::{PgConnection, Row};

mod copy_text;
mod load;
mod seal;
mod verify;
mod write;

pub use copy_text::{COLUMNS as COPY_COLUMNS, copy_line};
pub use seal::build_indexes;
pub use write::{prune_tombstones, upsert_rows};

/// Subscription name, and so consumer group `herald.search`.
pub const SUBSCRIPTION: &str = "search";
const PROJECTION: &str = "search";

/// The search projection: `herald.export.completed` (a document) and
/// `herald.export.deleted` (a tombstone), versioned, so writing a fact twice
/// changes nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Search;

impl Projection for Search {
    const NAME: &'static str = PROJECTION;
    const IDEMPOTENT: bool = true;
    const WRITES_PG: bool = true;
    type Fact = Fact;

    fn handles(event_type: &str) -> bool {
        Fact::handles(event_type)
    }

    fn fact(event: &DecodedEvent) -> Result<Fact, HandlerError> {
        Fact::of(event)?.ok_or_else(|| HandlerError::Reject(format!("search does not apply {}", event.event_type)))
    }

    async fn write(&self, tx: &mut Tx<'_>, generation: i64, facts: &[&Fact]) -> Result<(), HandlerError> {
        Ok(write::write(tx, generation, &newest_per_job(facts.iter().copied())).await?)
    }

    async fn write_pg(
        &self,
        tx: &mut PgConnection,
        generation: i64,
        storage: Option<&str>,
        facts: &[&Fact],
        path: WritePath,
    ) -> Result<(), HandlerError> {
        write_pg_rows(facts, path, |rows, upsert| async move { load::write_live(tx, generation, storage, &rows, upsert).await }).await
    }

    async fn load_pg(
        &self,
        tx: &mut PgConnection,
        generation: i64,
        facts: &[Arrived<'_, Fact>],
        path: WritePath,
    ) -> Result<(), HandlerError> {
        match path {
            // The replay's common case: appended as they came, jobs loaded
            // twice settled by the seal.
            WritePath::Plain => load::copy(tx, generation, facts).await.map_err(HandlerError::from_plain_write),
            // Only where the table has its key already (`load::write`).
            WritePath::Upsert => {
                write_pg_rows(&Arrived::facts(facts), path, |rows, upsert| async move { load::write(tx, generation, &rows, upsert).await })
                    .await
            }
        }
    }

    async fn prepare_load(&self, db: &Db, generation: i64) -> Result<(), StoreError> {
        load::prepare(db, generation).await
    }

    async fn seal_load(&self, db: &Db, generation: i64) -> Result<Option<String>, StoreError> {
        seal::seal(db, generation).await
    }

    async fn fingerprint(&self, tx: &mut Tx<'_>, generation: i64) -> Result<Fingerprint, StoreError> {
        verify::fingerprint(tx, generation).await
    }

    async fn verify_source(&self, db: &Db, generation: i64, settled: &Settled) -> Result<Option<Vec<String>>, StoreError> {
        Ok(Some(verify::against_jobs(db, generation, settled).await?))
    }
}

/// One document per job, written as `path` says by `write` (live traffic's
/// table for the generation, or a loading generation's own).
async fn write_pg_rows<W, F>(facts: &[&Fact], path: WritePath, write: W) -> Result<(), HandlerError>
where
    W: FnOnce(Vec<DocumentRow>, bool) -> F,
    F: std::future::Future<Output = Result<(), sqlx::Error>>,
{
    let rows: Vec<DocumentRow> = newest_per_job(facts.iter().copied()).into_iter().map(DocumentRow::from).collect();
    match path {
        WritePath::Plain => write(rows, false).await.map_err(HandlerError::from_plain_write),
        WritePath::Upsert => write(rows, true).await.map_err(|e| HandlerError::from(StoreError::from(e))),
    }
}

/// What the search projection learns about one job from one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fact {
    /// The job finished: its document.
    Completed(ExportCompleted),
    /// The job was deleted: its document goes, a tombstone with the business
    /// version stays, so an older `completed` delivered later (another
    /// partition's lag, a redelivery, a replay) can never bring it back.
    Deleted(ExportDeleted),
}

impl Fact {
    pub fn handles(event_type: &str) -> bool {
        event_type == ExportCompleted::EVENT_TYPE || event_type == ExportDeleted::EVENT_TYPE
    }

    /// The fact `event` carries, `None` for event types search ignores.
    pub fn of(event: &DecodedEvent) -> Result<Option<Fact>, EnvelopeError> {
        Ok(match event.event_type.as_str() {
            ExportCompleted::EVENT_TYPE => Some(Fact::Completed(event.data_as()?)),
            ExportDeleted::EVENT_TYPE => Some(Fact::Deleted(event.data_as()?)),
            _ => None,
        })
    }

    pub fn job_id(&self) -> &str {
        match self {
            Fact::Completed(c) => &c.job_id,
            Fact::Deleted(d) => &d.job_id,
        }
    }

    pub fn version(&self) -> i64 {
        match self {
            Fact::Completed(c) => c.version,
            Fact::Deleted(d) => d.version,
        }
    }
}

/// One fact per job: the newest business version among `facts` (one
/// statement may not touch the same row twice on PostgreSQL), of equal
/// versions the first; in job order.
pub fn newest_per_job<'a>(facts: impl IntoIterator<Item = &'a Fact>) -> Vec<&'a Fact> {
    let mut newest: Vec<&Fact> = facts.into_iter().collect();
    // Stable: of a job's equal versions the first seen stays first.
    newest.sort_by(|a, b| a.job_id().cmp(b.job_id()).then(b.version().cmp(&a.version())));
    newest.dedup_by(|later, kept| later.job_id() == kept.job_id());
    newest
}

/// One row of `search_documents`: a document, or a tombstone (`deleted_at_ms`
/// set, every other field blanked so nothing of the deleted job stays
/// searchable or readable).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct DocumentRow {
    pub job_id: String,
    pub caller: String,
    pub format: String,
    pub query: String,
    pub result_id: String,
    pub size_bytes: i64,
    pub completed_at_ms: i64,
    pub version: i64,
    pub deleted_at_ms: Option<i64>,
}

/// A row of `search_documents` borrowed from the fact it is made of: what a
/// replay formats for `COPY` without copying the fact's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DocumentRef<'a> {
    pub job_id: &'a str,
    pub caller: &'a str,
    pub format: &'a str,
    pub query: &'a str,
    pub result_id: &'a str,
    pub size_bytes: i64,
    pub completed_at_ms: i64,
    pub version: i64,
    pub deleted_at_ms: Option<i64>,
}

impl<'a> From<&'a Fact> for DocumentRef<'a> {
    fn from(fact: &'a Fact) -> DocumentRef<'a> {
        match fact {
            Fact::Completed(c) => DocumentRef {
                job_id: &c.job_id,
                caller: &c.caller,
                format: &c.format,
                query: &c.query,
                result_id: &c.result_id,
                size_bytes: c.size_bytes,
                completed_at_ms: c.completed_at_ms,
                version: c.version,
                deleted_at_ms: None,
            },
            Fact::Deleted(d) => DocumentRef {
                job_id: &d.job_id,
                caller: &d.caller,
                format: "",
                query: "",
                result_id: "",
                size_bytes: 0,
                completed_at_ms: 0,
                version: d.version,
                deleted_at_ms: Some(d.deleted_at_ms),
            },
        }
    }
}

impl From<DocumentRef<'_>> for DocumentRow {
    fn from(row: DocumentRef<'_>) -> DocumentRow {
        DocumentRow {
            job_id: row.job_id.to_owned(),
            caller: row.caller.to_owned(),
            format: row.format.to_owned(),
            query: row.query.to_owned(),
            result_id: row.result_id.to_owned(),
            size_bytes: row.size_bytes,
            completed_at_ms: row.completed_at_ms,
            version: row.version,
            deleted_at_ms: row.deleted_at_ms,
        }
    }
}

impl From<&Fact> for DocumentRow {
    fn from(fact: &Fact) -> DocumentRow {
        DocumentRef::from(fact).into()
    }
}

/// One finished export of the caller's that matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SearchHit {
    pub job_id: String,
    pub format: String,
    pub query: String,
    pub result_id: String,
    pub size_bytes: i64,
    pub completed_at_ms: i64,
}

/// The answer of `GET /v1/search`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
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
    let indexed = uses_text_index(db.backend(), text);
    let mut query = sqlx::query(search_statement(db.backend(), indexed)).bind(generation).bind(caller).bind(pattern).bind(limit);
    if indexed {
        query = query.bind(fts_phrase(text));
    }
    let rows = query.fetch_all(&mut *tx).await?;
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

/// Documents (not tombstones) in the active generation, for reports and audits.
pub async fn count_active(db: &Db) -> Result<i64, StoreError> {
    let row = sqlx::query(
        "SELECT COUNT(*) AS n FROM search_documents d JOIN active_generations g \
         ON g.projection = $1 AND d.generation = g.generation WHERE d.deleted_at_ms IS NULL",
    )
    .bind(PROJECTION)
    .fetch_one(db.pool())
    .await?;
    Ok(row.try_get("n")?)
}

/// The search's statement. Both backends filter with the exact `LIKE`; on
/// SQLite, when the text is long enough for trigrams, the FTS5 index first
/// narrows the rows to those containing it ($5, a phrase). PostgreSQL's
/// trigram index serves the `LIKE` itself.
pub fn search_statement(backend: Backend, text_index: bool) -> &'static str {
    macro_rules! search {
        ($narrowed:literal) => {
            concat!(
                "SELECT job_id, format, query, result_id, size_bytes, completed_at_ms FROM search_documents \
                 WHERE generation = $1 AND caller = $2 AND deleted_at_ms IS NULL AND lower(query) LIKE $3 ESCAPE '\\' ",
                $narrowed,
                "ORDER BY completed_at_ms DESC, job_id LIMIT $4"
            )
        };
    }
    const PLAIN: &str = search!("");
    const SQLITE_INDEXED: &str = search!("AND rowid IN (SELECT rowid FROM search_fts WHERE search_fts MATCH $5) ");
    match (backend, text_index) {
        (Backend::Sqlite, true) => SQLITE_INDEXED,
        _ => PLAIN,
    }
}

/// Whether [`search_statement`] uses the SQLite text index for `text`:
/// trigrams need three characters.
pub fn uses_text_index(backend: Backend, text: &str) -> bool {
    backend == Backend::Sqlite && text.chars().count() >= 3
}

/// `text` as an FTS5 phrase: quoted, its quotes doubled, so no character
/// of it is query syntax.
pub fn fts_phrase(text: &str) -> String {
    format!("\"{}\"", text.replace('"', "\"\""))
}

fn escape_like(text: &str) -> String {
    text.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completed(job: &str, version: i64) -> Fact {
        Fact::Completed(ExportCompleted {
            job_id: job.into(),
            caller: "alice".into(),
            format: "csv".into(),
            query: "q".into(),
            result_id: "r".into(),
            size_bytes: 1,
            sha256: String::new(),
            completed_at_ms: 1,
            version,
            content_type: "text/csv".into(),
        })
    }

    fn deleted(job: &str, version: i64) -> Fact {
        Fact::Deleted(ExportDeleted { job_id: job.into(), caller: "alice".into(), deleted_at_ms: 9, version })
    }

    #[test]
    fn the_newest_version_wins_whatever_the_order() {
        let facts = [completed("b", 2), deleted("a", 3), completed("a", 2), completed("b", 4), deleted("b", 4)];
        assert_eq!(newest_per_job(&facts), vec![&deleted("a", 3), &completed("b", 4)], "in job order; of equal versions the first");
    }

    #[test]
    fn a_tombstone_keeps_the_version_and_blanks_the_document() {
        let row = DocumentRow::from(&deleted("a", 3));
        assert_eq!((row.version, row.deleted_at_ms, row.query.as_str(), row.result_id.as_str()), (3, Some(9), "", ""));
        assert_eq!(DocumentRow::from(&completed("a", 2)).deleted_at_ms, None);
    }
}
