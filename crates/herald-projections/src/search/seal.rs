//! The seal of a loaded search generation on PostgreSQL (see `load`): its
//! indexes built once over the loaded rows, a job loaded twice settled as
//! the version guard would have, the primary key built, live traffic's rows
//! of the generation merged, and the table attached as the generation's
//! partition. Every step can run again: a rebuild that stopped in the
//! middle of it seals again when it resumes.

use herald_store::{Backend, Db, StoreError, Tx};
use tracing::info;

use super::load::{ARRIVAL, TOMBSTONES, prepare, table};
use super::write::{TABLE, guard};

/// SQLSTATE of an attach whose values another partition already holds.
const OVERLAPS: &str = "42P17";

/// Builds the loaded table's indexes, merges live traffic's rows of the
/// generation into it and attaches it; returns it, the generation's
/// partition from now on. Nothing to do once attached. `None`: the
/// generation's rows stay where they were (SQLite; the old table's).
pub(super) async fn seal(db: &Db, generation: i64) -> Result<Option<String>, StoreError> {
    if db.backend() != Backend::Postgres {
        return Ok(None);
    }
    let table = table(generation);
    // Asked first: live traffic writes an attached table, and preparing it
    // again would lock it against them (`CREATE INDEX IF NOT EXISTS` locks
    // before it looks).
    if attached(db, &table).await? {
        return Ok(Some(table));
    }
    prepare(db, generation).await?;
    build_indexes(db, &table).await?;
    Ok(attach(db, &table, generation).await?.then_some(table))
}

/// Whether `table` is a partition already; false when there is no such table.
pub(super) async fn attached(db: &Db, table: &str) -> Result<bool, StoreError> {
    let sql = "SELECT EXISTS (SELECT 1 FROM pg_class WHERE oid = to_regclass($1) AND relispartition)";
    Ok(sqlx::query_scalar(sql).bind(table).fetch_one(db.pool()).await?)
}

/// Builds the parent's indexes on `table` under its own names, the primary
/// key's as a unique index (the attach makes it the key): the trigram GIN
/// on one connection, the btrees on another. PostgreSQL 15 builds the GIN
/// in one process, and it takes longest: the btrees are built without
/// parallel workers, which would only take the GIN's core from it and make
/// the build as a whole slower (BENCHMARKS.md, "The btrees give the GIN its
/// core"); the key's fits beside it too ("The key built at the seal"). A
/// job loaded twice fails the key: once the GIN is built, the rows the
/// version guard would not have kept go and the key is built again. Plain
/// builds: nothing else writes the table before it is attached. Public so a
/// benchmark's floor builds exactly these.
pub async fn build_indexes(db: &Db, table: &str) -> Result<(), StoreError> {
    let trigram = format!(
        "CREATE INDEX IF NOT EXISTS {table}_query_trgm ON {table} USING gin (lower(query) gin_trgm_ops) \
         WITH (gin_pending_list_limit = 512)"
    );
    let btrees = [
        format!("CREATE INDEX IF NOT EXISTS {table}_by_caller ON {table} (generation, caller, completed_at_ms DESC)"),
        // The loading table has it already (`load::prepare`); a benchmark's floor not.
        format!("CREATE INDEX IF NOT EXISTS {table}_tombstones ON {table} {TOMBSTONES}"),
    ];
    let key = format!("CREATE UNIQUE INDEX IF NOT EXISTS {table}_pkey ON {table} (generation, job_id)");
    let gin = async { sqlx::query(&trigram).execute(db.pool()).await.map(drop).map_err(StoreError::from) };
    let others = async {
        let mut tx = db.begin().await?;
        sqlx::query("SET LOCAL max_parallel_maintenance_workers = 0").execute(&mut *tx).await?;
        for sql in &btrees {
            sqlx::query(sql).execute(&mut *tx).await?;
        }
        sqlx::query("SAVEPOINT search_key").execute(&mut *tx).await?;
        let keyed = match sqlx::query(&key).execute(&mut *tx).await {
            Ok(_) => true,
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                sqlx::query("ROLLBACK TO SAVEPOINT search_key").execute(&mut *tx).await?;
                false
            }
            Err(e) => return Err(StoreError::from(e)),
        };
        tx.commit().await?;
        Ok(keyed)
    };
    let ((), keyed) = tokio::try_join!(gin, others)?;
    if !keyed {
        let superseded = drop_superseded(db, table).await?;
        info!(table, superseded, "search: jobs loaded more than once settled before the key");
        sqlx::query(&key).execute(db.pool()).await?;
    }
    Ok(())
}

/// Deletes the rows of jobs loaded more than once that the version guard
/// would not have kept: of a job's rows the newest version stays, of equal
/// versions the first to arrive (a row without an arrival was loaded by an
/// earlier Herald, before any with one). Returns how many went. Offsets of
/// different partitions compare as numbers: the order they give is one a
/// replay reading the partitions side by side could have met them in.
async fn drop_superseded(db: &Db, table: &str) -> Result<u64, StoreError> {
    // The rows' places as an array: PostgreSQL deletes them by place
    // instead of scanning the table once more to join them.
    let sql = format!(
        "DELETE FROM {table} WHERE ctid = ANY (ARRAY( \
             SELECT place FROM ( \
                 SELECT ctid AS place, row_number() OVER \
                     (PARTITION BY job_id ORDER BY version DESC, {ARRIVAL} ASC NULLS FIRST) AS rank \
                 FROM {table} WHERE job_id IN (SELECT job_id FROM {table} GROUP BY job_id HAVING COUNT(*) > 1) \
             ) ranked WHERE rank > 1))"
    );
    Ok(sqlx::query(&sql).execute(db.pool()).await?.rows_affected())
}

/// One transaction: live traffic's rows of the generation leave the default
/// partition for the table under the version guard, the table loses its
/// `arrival` and gains its primary key (its unique index), and it becomes
/// the generation's partition; true when it did. A generation
/// opened before migration 0024 has its values in the old table's
/// partition: its loaded rows are merged there instead (false).
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
    key(&mut tx, table).await?;
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

/// The loading table made a document table: `arrival` dropped (PostgreSQL
/// only marks the column) and the unique index its primary key, unless an
/// earlier seal or Herald made it so.
async fn key(tx: &mut Tx<'_>, table: &str) -> Result<(), StoreError> {
    sqlx::query(&format!("ALTER TABLE {table} DROP COLUMN IF EXISTS {ARRIVAL}")).execute(&mut **tx).await?;
    let keyed: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = to_regclass($1) AND contype = 'p')")
        .bind(table)
        .fetch_one(&mut **tx)
        .await?;
    if !keyed {
        let sql = format!("ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY USING INDEX {table}_pkey");
        sqlx::query(&sql).execute(&mut **tx).await?;
    }
    Ok(())
}
