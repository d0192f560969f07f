//! How a replay loads a search generation on PostgreSQL: into a table of its
//! own (`search_documents_g<N>`) with its primary key only and a check that
//! every row is of generation N; then, once the replay reached its boundary,
//! the other indexes built once over the loaded rows, what live traffic
//! wrote into the generation meanwhile (the default partition's rows of N)
//! merged under the version guard, and the table attached as the
//! generation's partition of `search_documents` (migration 0024). Building
//! an index once over a million rows costs PostgreSQL about half of keeping
//! it row by row (BENCHMARKS.md, "Rebuild").
//!
//! The check lets the attach skip its scan and the indexes match the
//! parent's, so the attach takes them as they are: its transaction holds
//! its locks for as long as moving live traffic's rows of N takes. Live
//! writes then name the partition (`write_live`). SQLite keeps one table
//! and none of this.

use herald_store::{Backend, Db, StoreError};
use sqlx::{PgConnection, Row};
use tracing::{info, warn};

use super::copy_text::{COLUMNS, copy_line};
use super::write::{TABLE, UNNEST_ROWS, guard, insert_unnest};
use super::{DocumentRef, DocumentRow, Fact};

/// The generation's own table: where its replay writes until the seal, and
/// then its partition.
pub(super) fn table(generation: i64) -> String {
    format!("{TABLE}_g{generation}")
}

/// SQLSTATE of an attach whose values another partition already holds.
const OVERLAPS: &str = "42P17";

/// The partition migration 0024 made of the table as it was, holding the
/// generations there were then.
const LEGACY: &str = "search_documents_legacy";

/// The replay's plain write of `facts` (one per job) into the generation's
/// own table: one `COPY`, formatted from the facts, which fails as a plain
/// insert does on a job already there (unique violation: the caller starts
/// over with [`write`] under the version guard).
pub(super) async fn copy(tx: &mut PgConnection, generation: i64, facts: &[&Fact]) -> Result<(), sqlx::Error> {
    if facts.is_empty() {
        return Ok(());
    }
    let mut lines = Vec::with_capacity(facts.len() * 128);
    for fact in facts {
        copy_line(&mut lines, generation, DocumentRef::from(*fact));
    }
    let mut copy = tx.copy_in_raw(&format!("COPY {} ({COLUMNS}) FROM STDIN", table(generation))).await?;
    copy.send(lines).await?;
    copy.finish().await?;
    Ok(())
}

/// The replay's write of `rows` into the generation's own table in one
/// statement: `upsert` under the version guard, else plainly.
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
/// already its partition). Autovacuum leaves it alone while it loads: the
/// inserts alone would start it every few hundred thousand rows.
pub(super) async fn prepare(db: &Db, generation: i64) -> Result<(), StoreError> {
    if db.backend() != Backend::Postgres {
        return Ok(());
    }
    let table = table(generation);
    let sql = format!(
        "CREATE TABLE IF NOT EXISTS {table} (LIKE {TABLE}, PRIMARY KEY (generation, job_id), \
         CONSTRAINT {table}_generation CHECK (generation = {generation})) WITH (autovacuum_enabled = false)"
    );
    sqlx::query(&sql).execute(db.pool()).await?;
    Ok(())
}

/// Builds the loaded table's indexes, merges live traffic's rows of the
/// generation into it and attaches it; returns it, the generation's
/// partition from now on. Nothing to do once attached. `None`: the
/// generation's rows stay where they were (SQLite; the old table's).
pub(super) async fn seal(db: &Db, generation: i64) -> Result<Option<String>, StoreError> {
    if db.backend() != Backend::Postgres {
        return Ok(None);
    }
    prepare(db, generation).await?;
    let table = table(generation);
    if attached(db, &table).await? {
        return Ok(Some(table));
    }
    build_indexes(db, &table).await?;
    Ok(attach(db, &table, generation).await?.then_some(table))
}

async fn attached(db: &Db, table: &str) -> Result<bool, StoreError> {
    let row = sqlx::query("SELECT relispartition FROM pg_class WHERE oid = to_regclass($1)").bind(table).fetch_one(db.pool()).await?;
    Ok(row.try_get("relispartition")?)
}

/// Builds the parent's indexes on `table` under its own names, the trigram
/// GIN on one connection and the two btrees on another. PostgreSQL 15
/// builds the GIN in one process, and it takes longest: the btrees are
/// built without parallel workers, which would only take the GIN's core
/// from it and make the build as a whole slower (BENCHMARKS.md, "The
/// btrees give the GIN its core"). Plain builds: nothing else writes the
/// table before it is attached. Public so a benchmark's floor builds
/// exactly these.
pub async fn build_indexes(db: &Db, table: &str) -> Result<(), StoreError> {
    let trigram = format!(
        "CREATE INDEX IF NOT EXISTS {table}_query_trgm ON {table} USING gin (lower(query) gin_trgm_ops) \
         WITH (gin_pending_list_limit = 512)"
    );
    let btrees = [
        format!("CREATE INDEX IF NOT EXISTS {table}_by_caller ON {table} (generation, caller, completed_at_ms DESC)"),
        format!("CREATE INDEX IF NOT EXISTS {table}_tombstones ON {table} (deleted_at_ms) WHERE deleted_at_ms IS NOT NULL"),
    ];
    let gin = async { sqlx::query(&trigram).execute(db.pool()).await.map(drop).map_err(StoreError::from) };
    let others = async {
        let mut tx = db.begin().await?;
        sqlx::query("SET LOCAL max_parallel_maintenance_workers = 0").execute(&mut *tx).await?;
        for sql in &btrees {
            sqlx::query(sql).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    };
    tokio::try_join!(gin, others)?;
    Ok(())
}

/// One transaction: live traffic's rows of the generation leave the default
/// partition for the table under the version guard, and the table becomes
/// the generation's partition; true when it did. A generation opened before
/// migration 0024 has its values in the old table's partition: its loaded
/// rows are merged there instead (false).
///
/// Writes through `search_documents` wait for the commit (its lock): one
/// that began before it would have routed its rows to the default
/// partition, where the attach makes rows of the generation a violation of
/// the partition's constraint, which PostgreSQL checks again and fails.
/// Waiting, it routes them to the new partition. Writes naming a partition
/// and reads do not wait.
async fn attach(db: &Db, table: &str, generation: i64) -> Result<bool, StoreError> {
    let mut tx = db.begin().await?;
    sqlx::query("LOCK TABLE search_documents IN SHARE ROW EXCLUSIVE MODE").execute(&mut *tx).await?;
    sqlx::query("LOCK TABLE search_documents_default IN ACCESS EXCLUSIVE MODE").execute(&mut *tx).await?;
    let merge = format!(
        "WITH moved AS (DELETE FROM search_documents_default WHERE generation = $1 RETURNING *) \
         INSERT INTO {table} SELECT * FROM moved{}",
        guard(table)
    );
    let moved = sqlx::query(&merge).bind(generation).execute(&mut *tx).await?.rows_affected();
    // Vacuumed as any partition from now on, not while the replay loaded it.
    sqlx::query(&format!("ALTER TABLE {table} RESET (autovacuum_enabled)")).execute(&mut *tx).await?;
    sqlx::query("SAVEPOINT search_attach").execute(&mut *tx).await?;
    let attach = format!("ALTER TABLE {TABLE} ATTACH PARTITION {table} FOR VALUES IN ({generation})");
    let attached = match sqlx::query(&attach).execute(&mut *tx).await {
        Ok(_) => {
            info!(generation, moved, "search generation attached as its partition");
            true
        }
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(OVERLAPS) => {
            sqlx::query("ROLLBACK TO SAVEPOINT search_attach").execute(&mut *tx).await?;
            let merged = format!("INSERT INTO search_documents SELECT * FROM {table}{}", guard(TABLE));
            let rows = sqlx::query(&merged).execute(&mut *tx).await?.rows_affected();
            sqlx::query(&format!("DROP TABLE {table}")).execute(&mut *tx).await?;
            info!(generation, rows, "search generation older than its own partitions: loaded rows merged into its partition");
            false
        }
        Err(e) => return Err(e.into()),
    };
    tx.commit().await?;
    Ok(attached)
}
