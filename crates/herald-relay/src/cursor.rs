//! Where a slice's reading stands, and the read forward from there.
//!
//! Reading forward must not skip a row whose transaction commits late. On
//! PostgreSQL the cursor is a pair of snapshots: rows visible in `hi` but not
//! in `lo` are exactly the rows committed between the two, whatever their
//! sequence numbers, and a row committing after `hi` falls into a later step.
//! Within a step rows go in (transaction id, sequence) order — one range scan
//! of the `(slice, xid, seq)` index from the cursor. On SQLite the single
//! writer commits in sequence order, so the sequence alone is the cursor.

use futures::TryStreamExt;
pub use herald_store::delivered::Cursor;
use herald_store::outbox::{self, OutboxRow, ROW_COLUMN_COUNT, ROW_COLUMNS};
use herald_store::{Db, StoreError};
use sqlx::{PgPool, Row};

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
    /// when first used.
    pub fn of(db: &Db, connections: u32) -> Result<Reader, StoreError> {
        Ok(match db.native_postgres(connections)? {
            Some(pool) => Reader::Postgres(pool),
            None => Reader::Sqlite(db.clone()),
        })
    }
}

/// Reads up to `limit` rows of `slice` after `cursor`, in order. On
/// PostgreSQL a cursor without `hi` first gets the current snapshot as `hi`
/// (returned in the updated cursor).
pub async fn read(reader: &Reader, slice: i32, cursor: &Cursor, limit: i64) -> Result<(Vec<OutboxRow>, Cursor), StoreError> {
    let live = format!("status IN ('{}', '{}')", outbox::PENDING, outbox::RETRYABLE_FAILED);
    let pool = match reader {
        Reader::Sqlite(db) => {
            let sql = format!("SELECT {ROW_COLUMNS} FROM outbox WHERE slice = $1 AND seq > $2 AND {live} ORDER BY seq LIMIT $3");
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
    // The xid range and the (xid, seq) position are one range scan of the
    // (slice, xid, seq) index, in order; the two visibility tests make the
    // step exact.
    let sql = format!(
        "SELECT {ROW_COLUMNS}, CAST(CAST(xid AS TEXT) AS BIGINT) AS row_xid FROM outbox WHERE slice = $1 \
         AND xid >= pg_snapshot_xmin(CAST($2 AS TEXT)::pg_snapshot) \
         AND (xid, seq) > (CAST(CAST($4 AS TEXT) AS xid8), $5) \
         AND xid < pg_snapshot_xmax(CAST($3 AS TEXT)::pg_snapshot) \
         AND NOT pg_visible_in_snapshot(xid, CAST($2 AS TEXT)::pg_snapshot) \
         AND pg_visible_in_snapshot(xid, CAST($3 AS TEXT)::pg_snapshot) \
         AND {live} ORDER BY xid, seq LIMIT $6"
    );
    // Each row converted as it arrives into a batch sized once: collecting
    // the driver's rows first grew two vectors per read, and glibc
    // consolidating its free lists for them showed in the drain's profile.
    let mut rows = Vec::with_capacity(usize::try_from(limit).unwrap_or_default());
    let query = sqlx::query(&sql).bind(slice).bind(&cursor.lo).bind(&hi).bind(cursor.xid).bind(cursor.seq).bind(limit);
    let mut stream = query.fetch(pool);
    while let Some(row) = stream.try_next().await? {
        let mut outbox_row = outbox::row_to_outbox(&row)?;
        outbox_row.xid = row.try_get(ROW_COLUMN_COUNT)?;
        rows.push(outbox_row);
    }
    drop(stream);
    Ok((rows, cursor))
}
