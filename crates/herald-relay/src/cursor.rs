//! Where a slice's reading stands, and the read forward from there.
//!
//! Reading forward must not skip a row whose transaction commits late. On
//! PostgreSQL the cursor is a pair of snapshots: rows visible in `hi` but not
//! in `lo` are exactly the rows committed between the two, whatever their
//! sequence numbers, and a row committing after `hi` falls into a later step.
//! Within a step rows go in (transaction id, sequence) order — one range scan
//! of the `(slice, xid, seq)` index from the cursor. On SQLite the single
//! writer commits in sequence order, so the sequence alone is the cursor.

use std::sync::LazyLock;

use futures::TryStreamExt;
pub use herald_store::delivered::Cursor;
use herald_store::outbox::{self, OutboxRow, ROW_COLUMN_COUNT, ROW_COLUMNS};
use herald_store::{Db, PLAN_ONCE, StoreError};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{PgPool, Postgres, Row};

/// Where a relay reads its slices from: on PostgreSQL a native pool of its
/// own (`Any` copies every row of a batch once more, with its column list —
/// most of the client's work per batch), on SQLite the store's one
/// connection.
pub enum Reader {
    Sqlite(Db),
    Postgres(PgPool),
}

impl Reader {
    /// At most `connections` sessions of their own on PostgreSQL, opened
    /// when first used. Their statements keep one generic plan: the read's
    /// plan is the same index range scan whatever the snapshots, and
    /// PostgreSQL otherwise planned it again on every execution (its
    /// estimate of the generic plan is worse than the custom ones'), which
    /// at 1,000 events/s — a read per slice woken, 1,400 a second — cost
    /// seven times the reads themselves (BENCHMARKS.md, "Latency").
    pub fn of(db: &Db, connections: u32) -> Result<Reader, StoreError> {
        Ok(match db.native_postgres_with(connections, &[PLAN_ONCE])? {
            Some(pool) => Reader::Postgres(pool),
            None => Reader::Sqlite(db.clone()),
        })
    }
}

/// The rows of slice `$1` a step from snapshot `$2` (`lo`) to `$3` (`hi`)
/// still has to read after position (`$4`, `$5`): one range scan of the
/// `(slice, xid, seq)` index, in order; the two visibility tests make the
/// step exact. The scan starts at whichever is later, the position or
/// `lo`'s `xmin` with the smallest sequence: no row below that `xmin`
/// belongs to the step. Both bounds go into the one row comparison because
/// PostgreSQL positions a scan by the row comparison alone when a plain
/// `xid >=` bound sits beside it — a step's first read, at position
/// (0, 0), then walked the slice's whole index from its first row
/// (BENCHMARKS.md, "Latency", "Every step walked the slice's history").
const STEP_RANGE: &str = "WHERE slice = $1 \
     AND (xid, seq) > (GREATEST(CAST(CAST($4 AS TEXT) AS xid8), pg_snapshot_xmin(CAST($2 AS TEXT)::pg_snapshot)), \
          CASE WHEN CAST(CAST($4 AS TEXT) AS xid8) < pg_snapshot_xmin(CAST($2 AS TEXT)::pg_snapshot) \
          THEN CAST(-9223372036854775808 AS BIGINT) ELSE $5 END) \
     AND xid < pg_snapshot_xmax(CAST($3 AS TEXT)::pg_snapshot) \
     AND NOT pg_visible_in_snapshot(xid, CAST($2 AS TEXT)::pg_snapshot) \
     AND pg_visible_in_snapshot(xid, CAST($3 AS TEXT)::pg_snapshot)";

/// Reads up to `limit` rows of `slice` after `cursor`, in order. On
/// PostgreSQL a cursor without `hi` first gets the current snapshot as `hi`
/// (returned in the updated cursor).
pub async fn read(reader: &Reader, slice: i32, cursor: &Cursor, limit: i64) -> Result<(Vec<OutboxRow>, Cursor), StoreError> {
    let pool = match reader {
        Reader::Sqlite(db) => {
            let sql = format!("SELECT {ROW_COLUMNS} FROM outbox WHERE slice = $1 AND seq > $2 AND {} ORDER BY seq LIMIT $3", live());
            let rows = sqlx::query(&sql).bind(slice).bind(cursor.seq).bind(limit).fetch_all(db.pool()).await?;
            return Ok((rows.iter().map(outbox::row_to_outbox).collect::<Result<_, _>>()?, cursor.clone()));
        }
        Reader::Postgres(pool) => pool,
    };
    let mut cursor = cursor.clone();
    let hi = match &cursor.hi {
        Some(hi) => hi.clone(),
        None => {
            let row = sqlx::query("SELECT CAST(pg_current_snapshot() AS TEXT) AS hi").fetch_one(pool).await?;
            let hi: String = row.try_get("hi")?;
            cursor = Cursor { lo: cursor.lo, hi: Some(hi.clone()), xid: 0, seq: 0 };
            hi
        }
    };
    // Each row converted as it arrives into a batch sized once: collecting
    // the driver's rows first grew two vectors per read, and glibc
    // consolidating its free lists for them showed in the drain's profile.
    let mut rows = Vec::with_capacity(usize::try_from(limit).unwrap_or_default());
    let mut stream = step_query(&STEP_SQL, slice, &cursor, &hi, limit).fetch(pool);
    while let Some(row) = stream.try_next().await? {
        let mut outbox_row = outbox::row_to_outbox(&row)?;
        outbox_row.xid = row.try_get(ROW_COLUMN_COUNT)?;
        rows.push(outbox_row);
    }
    drop(stream);
    Ok((rows, cursor))
}

/// Rows the relay still sends: not delivered, dead-lettered or set aside.
fn live() -> String {
    format!("status IN ('{}', '{}')", outbox::PENDING, outbox::RETRYABLE_FAILED)
}

/// A step's read on PostgreSQL, built once: the relay reads it
/// thousands of times a second at a low rate (a read per slice woken).
static STEP_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {ROW_COLUMNS}, CAST(CAST(xid AS TEXT) AS BIGINT) AS row_xid FROM outbox {STEP_RANGE} AND {} ORDER BY xid, seq LIMIT $6",
        live()
    )
});

/// `sql` (the step's read, or a statement around it) bound as
/// [`STEP_RANGE`] says, `$6` the limit.
fn step_query<'q>(sql: &'q str, slice: i32, cursor: &'q Cursor, hi: &'q str, limit: i64) -> Query<'q, Postgres, PgArguments> {
    sqlx::query(sql).bind(slice).bind(&cursor.lo).bind(hi).bind(cursor.xid).bind(cursor.seq).bind(limit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    const SLICE: i32 = 3;

    /// `n` rows of [`SLICE`], committed together.
    async fn append(pool: &PgPool, from: i32, n: i32) -> anyhow::Result<()> {
        sqlx::query(
            "INSERT INTO outbox (event_id, source, event_type, subject, event_time_ms, schema_file, data, topic, partition_key, \
             created_at_ms, slice) \
             SELECT 'e-' || i, '/s', 't', 'j', 0, 'f.avsc', '\\x00', 'topic', 'k', 0, $3 FROM generate_series($1, $2) AS i",
        )
        .bind(from)
        .bind(from + n - 1)
        .bind(SLICE)
        .execute(pool)
        .await?;
        Ok(())
    }

    async fn snapshot(pool: &PgPool) -> anyhow::Result<String> {
        Ok(sqlx::query_scalar("SELECT CAST(pg_current_snapshot() AS TEXT)").fetch_one(pool).await?)
    }

    /// A step's first read, 20,000 rows of the slice delivered behind it:
    /// it finds the 10 new rows and reads a handful of pages, not the
    /// slice's history, with the plan the reader's sessions keep. On the
    /// statement before (an `xid >=` bound beside the row comparison),
    /// PostgreSQL positioned the scan at (0, 0) and the same read touched
    /// 101 pages.
    #[tokio::test]
    async fn a_step_starts_at_its_snapshot_not_at_the_slice_history_postgres() -> anyhow::Result<()> {
        let test_db = herald_testkit::postgres_db().await?;
        let db = Db::connect_and_migrate(&test_db.url).await?;
        let reader = Reader::of(&db, 1)?;
        let Reader::Postgres(pool) = &reader else { anyhow::bail!("a PostgreSQL reader") };
        append(pool, 0, 20_000).await?;
        let lo = snapshot(pool).await?;
        append(pool, 20_000, 10).await?;
        let hi = snapshot(pool).await?;
        let step = Cursor { lo, hi: Some(hi.clone()), xid: 0, seq: 0 };

        let (rows, _) = read(&reader, SLICE, &step, 1000).await?;
        let ids: Vec<&str> = rows.iter().map(|r| r.event.id.as_str()).collect();
        assert_eq!(ids, (20_000..20_010).map(|i| format!("e-{i}")).collect::<Vec<_>>(), "the step's rows, in order");

        let mut conn = pool.acquire().await?;
        let mode: String = sqlx::query_scalar("SHOW plan_cache_mode").fetch_one(&mut *conn).await?;
        assert_eq!(mode, PLAN_ONCE.1, "the reader's sessions plan a statement once");
        let explain = format!("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {}", *STEP_SQL);
        let plan: Vec<String> =
            step_query(&explain, SLICE, &step, &hi, 1000).fetch_all(&mut *conn).await?.iter().map(|r| r.get(0)).collect();
        let plan = plan.join("\n");
        let pages: u64 = plan
            .lines()
            .find_map(|l| l.trim().strip_prefix("Buffers: shared "))
            .context(format!("buffers in the plan:\n{plan}"))?
            .split(' ')
            .filter_map(|part| part.split_once('=').and_then(|(_, n)| n.parse::<u64>().ok()))
            .sum();
        assert!(pages < 30, "a step's first read touched {pages} pages:\n{plan}");
        drop(conn);
        db.close().await;
        Ok(())
    }
}
