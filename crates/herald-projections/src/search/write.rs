//! Writing documents into a generation. Two paths, same statements in
//! effect: the shared `Any` path ([`upsert_rows`]) and, on PostgreSQL,
//! sqlx's native driver with array binds ([`UNNEST_ROWS`], run by `load`,
//! which names the table: `search_documents` or one generation's
//! partition): `Any` cannot bind arrays, and multi-row `VALUES` through it
//! spends most of a replay's time in the client (BENCHMARKS.md "Rebuild").

use herald_store::{StoreError, Tx};
use sqlx::PgConnection;

use super::{DocumentRow, Fact};

/// Where reads find every generation's documents.
pub(super) const TABLE: &str = "search_documents";

/// Writes `facts` (at most one per job) into `generation`.
pub(super) async fn write(tx: &mut Tx<'_>, generation: i64, facts: &[&Fact]) -> Result<(), StoreError> {
    let rows: Vec<DocumentRow> = facts.iter().map(|f| DocumentRow::from(*f)).collect();
    upsert_rows(tx, generation, &rows).await
}

/// Writes rows into `generation` unless it already holds a newer business
/// version of the same job: facts may arrive out of order across partitions,
/// replays and live traffic; the version decides, not arrival. A tombstone
/// is a row like any other, so the same guard keeps an older document from
/// replacing it. Applying the same row twice changes nothing, which is what
/// lets a replay and live traffic both write a generation being rebuilt.
///
/// Most batches only add documents, and a plain `INSERT` costs PostgreSQL
/// far less than `ON CONFLICT … DO UPDATE`: so the rows are first inserted
/// plainly behind a savepoint, and only when one of the jobs already has a
/// row is the savepoint rolled back and the batch upserted under the guard.
pub async fn upsert_rows(tx: &mut Tx<'_>, generation: i64, rows: &[DocumentRow]) -> Result<(), StoreError> {
    sqlx::query("SAVEPOINT search_write").execute(&mut **tx).await?;
    match insert_rows(tx, generation, rows, false).await {
        Ok(()) => return Ok(()),
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
            sqlx::query("ROLLBACK TO SAVEPOINT search_write").execute(&mut **tx).await?;
        }
        Err(e) => return Err(e.into()),
    }
    Ok(insert_rows(tx, generation, rows, true).await?)
}

/// `upsert`: replace older versions instead of failing on an existing row.
async fn insert_rows(tx: &mut Tx<'_>, generation: i64, rows: &[DocumentRow], upsert: bool) -> Result<(), sqlx::Error> {
    let guard = if upsert { guard(TABLE) } else { String::new() };
    // Few distinct statement sizes keep PostgreSQL's prepared-statement cache warm.
    for chunk in herald_store::outbox::statement_chunks(rows) {
        let values: Vec<String> = (0..chunk.len()).map(|i| format!("({})", herald_store::outbox::placeholders(i * 10 + 1, 10))).collect();
        let sql = format!(
            "INSERT INTO search_documents (generation, job_id, caller, format, query, result_id, \
             size_bytes, completed_at_ms, version, deleted_at_ms) VALUES {}{guard}",
            values.join(", ")
        );
        let mut query = sqlx::query(&sql);
        for row in chunk {
            query = query
                .bind(generation)
                .bind(&row.job_id)
                .bind(&row.caller)
                .bind(&row.format)
                .bind(&row.query)
                .bind(&row.result_id)
                .bind(row.size_bytes)
                .bind(row.completed_at_ms)
                .bind(row.version)
                .bind(row.deleted_at_ms);
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}

/// Up to `limit` tombstones, of any generation, of deletes before
/// `before_ms`. The caller has made sure nothing retained can still bring
/// their documents back (the retention floor): a tombstone is only there to
/// outvote an older `completed` delivered late.
pub async fn prune_tombstones(db: &herald_store::Db, before_ms: i64, limit: i64) -> Result<herald_store::prune::Batch, StoreError> {
    let done = sqlx::query(
        "DELETE FROM search_documents WHERE (generation, job_id) IN \
         (SELECT generation, job_id FROM search_documents WHERE deleted_at_ms < $1 LIMIT $2)",
    )
    .bind(before_ms)
    .bind(limit)
    .execute(db.pool())
    .await?;
    Ok(herald_store::prune::Batch::limited(done.rows_affected(), limit))
}

/// The version guard of an insert into `table`: a row already there is
/// replaced only by a newer business version.
pub(super) fn guard(table: &str) -> String {
    format!(
        " ON CONFLICT (generation, job_id) DO UPDATE SET caller = excluded.caller, format = excluded.format, \
         query = excluded.query, result_id = excluded.result_id, size_bytes = excluded.size_bytes, \
         completed_at_ms = excluded.completed_at_ms, version = excluded.version, deleted_at_ms = excluded.deleted_at_ms \
         WHERE {table}.version < excluded.version"
    )
}

/// The columns and rows of an array-bound insert: `$1` the generation, the
/// others one array per column ([`insert_unnest`] binds them).
pub(super) const UNNEST_ROWS: &str = "(generation, job_id, caller, format, query, result_id, size_bytes, completed_at_ms, \
     version, deleted_at_ms) \
     SELECT $1, * FROM UNNEST($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int8[], $8::int8[], \
     $9::int8[], $10::int8[])";

/// Runs `sql`, an insert of [`UNNEST_ROWS`], with `rows` bound as arrays.
pub(super) async fn insert_unnest(tx: &mut PgConnection, sql: &str, generation: i64, rows: &[DocumentRow]) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    sqlx::query(sql)
        .bind(generation)
        .bind(rows.iter().map(|r| r.job_id.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.caller.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.format.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.query.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.result_id.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.size_bytes).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.completed_at_ms).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.version).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.deleted_at_ms).collect::<Vec<_>>())
        .execute(&mut *tx)
        .await?;
    Ok(())
}
