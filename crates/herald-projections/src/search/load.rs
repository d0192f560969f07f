//! How a replay loads a search generation on PostgreSQL: into a table of its
//! own (`search_documents_g<N>`) with no key (only the tombstones' partial
//! index, cheap to keep), a check that every row is of generation N, and
//! one column more than a document's, the offset each row arrived at; then,
//! once the replay reached its boundary, the indexes built once over the
//! loaded rows, the primary key among them (`seal`). A job loaded twice
//! (two of its events) is settled before the key is built: the newest
//! version stays, of equal versions the first to arrive, as the version
//! guard would have kept them. What live traffic wrote into the generation
//! meanwhile (the default partition's rows of N) is merged under the
//! version guard, and the table attached as the generation's partition of
//! `search_documents` (migration 0024). Building an index once over a
//! million rows costs PostgreSQL about half of keeping it row by row, the
//! key included (BENCHMARKS.md, "Rebuild", "The key built at the seal").
//!
//! The check lets the attach skip its scan and the indexes match the
//! parent's, so the attach takes them as they are: its transaction holds
//! its locks for as long as moving live traffic's rows of N takes. Live
//! writes then name the partition (`write_live`). SQLite keeps one table
//! and none of this.

use herald_consumer::Arrived;
use herald_store::{Backend, Db, StoreError};
use sqlx::PgConnection;
use tracing::warn;

use super::copy_text::{COLUMNS, copy_line};
use super::seal::attached;
use super::write::{TABLE, UNNEST_ROWS, guard, insert_unnest};
use super::{DocumentRef, DocumentRow, Fact};

/// The generation's own table: where its replay writes until the seal, and
/// then its partition.
pub(super) fn table(generation: i64) -> String {
    format!("{TABLE}_g{generation}")
}

/// The tombstone index's columns and predicate, the parent's.
pub(super) const TOMBSTONES: &str = "(deleted_at_ms) WHERE deleted_at_ms IS NOT NULL";

/// The loading table's column beyond a document's: the offset the row's
/// record arrived at in its partition. Dropped when the table is attached.
pub(super) const ARRIVAL: &str = "arrival";

/// The partition migration 0024 made of the table as it was, holding the
/// generations there were then.
const LEGACY: &str = "search_documents_legacy";

/// The replay's plain write of `facts` into the generation's own table:
/// one `COPY`, formatted from the facts, each row with the offset its
/// record arrived at. Appends: the table has no key yet to meet a job
/// already loaded on ([`seal`] settles those).
pub(super) async fn copy(tx: &mut PgConnection, generation: i64, facts: &[Arrived<'_, Fact>]) -> Result<(), sqlx::Error> {
    if facts.is_empty() {
        return Ok(());
    }
    let mut lines = Vec::with_capacity(facts.len() * 128);
    for arrived in facts {
        copy_line(&mut lines, generation, DocumentRef::from(arrived.fact), arrived.offset);
    }
    let mut copy = tx.copy_in_raw(&format!("COPY {} ({COLUMNS}) FROM STDIN", table(generation))).await?;
    copy.send(lines).await?;
    copy.finish().await?;
    Ok(())
}

/// The replay's write of `rows` into the generation's own table in one
/// statement: `upsert` under the version guard, else plainly. Only where
/// the table has a key: one an earlier Herald began loading keeps it (see
/// [`prepare`]); elsewhere [`copy`] appends and nothing conflicts.
pub(super) async fn write(tx: &mut PgConnection, generation: i64, rows: &[DocumentRow], upsert: bool) -> Result<(), sqlx::Error> {
    insert_into(tx, &table(generation), generation, rows, upsert).await
}

/// Live traffic's write of `rows` into `generation`: into the partition
/// `storage` names when it is one a generation of search has (its own
/// table, or the old one), else through `search_documents`, which routes
/// the rows itself. Naming the partition spares PostgreSQL the routing,
/// 8-19 % of the insert (BENCHMARKS.md, "Loaded, then indexed once");
/// anything else in `storage` is not named in SQL.
pub(super) async fn write_live(
    tx: &mut PgConnection,
    generation: i64,
    storage: Option<&str>,
    rows: &[DocumentRow],
    upsert: bool,
) -> Result<(), sqlx::Error> {
    let table = match storage {
        Some(LEGACY) => LEGACY,
        Some(own) if own == table(generation) => own,
        Some(other) => {
            warn!(generation, storage = other, "search: storage is not a table of the generation's, writing search_documents");
            TABLE
        }
        None => TABLE,
    };
    insert_into(tx, table, generation, rows, upsert).await
}

/// One statement writing `rows` into `table` (`search_documents` or a
/// partition of it): `upsert` false inserts plainly and fails on a job
/// already there (the caller starts over with `upsert`), true applies the
/// version guard.
async fn insert_into(tx: &mut PgConnection, table: &str, generation: i64, rows: &[DocumentRow], upsert: bool) -> Result<(), sqlx::Error> {
    let tail = if upsert { guard(table) } else { String::new() };
    insert_unnest(tx, &format!("INSERT INTO {table} {UNNEST_ROWS}{tail}"), generation, rows).await
}

/// Creates the generation's own table unless it is there (loading, or
/// already its partition), with the one index it keeps while loading.
/// Autovacuum leaves it alone while it loads: the inserts alone would start
/// it every few hundred thousand rows. A table an
/// earlier Herald began loading has its primary key and no `arrival`: it
/// gains the column and keeps its key (a job loaded again then conflicts,
/// and the replay writes it under the version guard).
pub(super) async fn prepare(db: &Db, generation: i64) -> Result<(), StoreError> {
    if db.backend() != Backend::Postgres {
        return Ok(());
    }
    let table = table(generation);
    let sql = format!(
        "CREATE TABLE IF NOT EXISTS {table} (LIKE {TABLE}, {ARRIVAL} BIGINT, \
         CONSTRAINT {table}_generation CHECK (generation = {generation})) WITH (autovacuum_enabled = false)"
    );
    sqlx::query(&sql).execute(db.pool()).await?;
    // Kept while loading: rows that are not tombstones cost it next to
    // nothing, and built at the seal it would read every row once more.
    let tombstones = format!("CREATE INDEX IF NOT EXISTS {table}_tombstones ON {table} {TOMBSTONES}");
    sqlx::query(&tombstones).execute(db.pool()).await?;
    // Looked up first: the ALTER's lock would wait for anyone reading the table.
    let arrives: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)",
    )
    .bind(&table)
    .bind(ARRIVAL)
    .fetch_one(db.pool())
    .await?;
    if !arrives && !attached(db, &table).await? {
        sqlx::query(&format!("ALTER TABLE {table} ADD COLUMN {ARRIVAL} BIGINT")).execute(db.pool()).await?;
    }
    Ok(())
}
