//! What "delivered" means for an outbox row: the relay's cursor for its
//! slice has passed it (issue 20), or an older release marked it.
//!
//! The relay records progress as one fenced cursor write per batch, not as a
//! status update per row: a cursor never passes a row still to publish, so
//! every row behind it is delivered — except the exceptions, rows set aside
//! as `failed` or `dead_lettered`, which keep a status of their own. Rows the
//! cursor passed keep the status they were written with (`pending`), and
//! every reader that says "delivered" derives it here: `herald outbox list`,
//! the audit, the status page, prune and a rebuild's verification.
//!
//! Releases before v0.11.0 wrote `delivered` on each row; such rows stay
//! delivered, so an outbox relayed by both (a rolling upgrade) reads right.

use serde::{Deserialize, Serialize};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::outbox::{DELIVERED, PENDING, RETRYABLE_FAILED};
use crate::{Backend, Db, StoreError};

/// Where a slice's reading stands. On PostgreSQL the cursor is a pair of
/// snapshots: rows visible in `lo` are done; rows visible in `hi` but not in
/// `lo` are the step being worked through, done up to (`xid`, `seq`). On
/// SQLite, whose single writer commits in sequence order, `seq` alone is the
/// cursor. The relay's `cursor` module reads forward from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// PostgreSQL snapshot every row of which is done.
    pub lo: String,
    /// Snapshot being worked through; `None` until the next read takes one.
    pub hi: Option<String>,
    /// Within `(lo, hi]`: rows up to (`xid`, `seq`) are done (PostgreSQL).
    pub xid: i64,
    /// On SQLite, the whole cursor: rows up to here are done.
    pub seq: i64,
}

impl Cursor {
    /// The cursor after the rows up to `done` (`(xid, seq)` of the last row
    /// done, if any) are done. `step_done` says the read returned everything
    /// left between `lo` and `hi`.
    pub fn after(&self, done: Option<(i64, i64)>, step_done: bool) -> Cursor {
        match (&self.hi, step_done, done) {
            (Some(hi), true, _) => Cursor { lo: hi.clone(), hi: None, xid: 0, seq: 0 },
            (_, _, Some((xid, seq))) => Cursor { xid, seq, ..self.clone() },
            (_, _, None) => self.clone(),
        }
    }

    /// The cursor columns of a `relay_slices` row (`cursor_lo`, `cursor_hi`,
    /// `cursor_xid`, `cursor_seq`).
    pub fn from_row(row: &AnyRow) -> Result<Cursor, sqlx::Error> {
        Ok(Cursor {
            lo: row.try_get("cursor_lo")?,
            hi: row.try_get("cursor_hi")?,
            xid: row.try_get("cursor_xid")?,
            seq: row.try_get("cursor_seq")?,
        })
    }
}

/// One slice's persisted cursor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceCursor {
    pub slice: i32,
    pub cursor: Cursor,
}

/// Every slice's persisted cursor, in slice order.
pub async fn cursors(conn: &mut sqlx::AnyConnection) -> Result<Vec<SliceCursor>, StoreError> {
    let rows =
        sqlx::query("SELECT slice, cursor_lo, cursor_hi, cursor_xid, cursor_seq FROM relay_slices ORDER BY slice").fetch_all(conn).await?;
    rows.iter().map(|r| Ok(SliceCursor { slice: r.try_get("slice")?, cursor: Cursor::from_row(r)? })).collect()
}

/// The outbox joined to its slices' cursors: `o` is the row, `s` its slice.
pub const FROM_OUTBOX: &str = "outbox o LEFT JOIN relay_slices s ON s.slice = o.slice";

/// Where the cursor's parts are, as SQL: columns of `s`, or literals.
struct Parts {
    lo: String,
    hi: Option<String>,
    xid: String,
    seq: String,
}

impl Parts {
    fn columns() -> Parts {
        Parts { lo: "s.cursor_lo".into(), hi: Some("s.cursor_hi".into()), xid: "s.cursor_xid".into(), seq: "s.cursor_seq".into() }
    }

    fn literal(cursor: &Cursor) -> Parts {
        Parts { lo: quote(&cursor.lo), hi: cursor.hi.as_deref().map(quote), xid: cursor.xid.to_string(), seq: cursor.seq.to_string() }
    }
}

fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// SQL: the cursor passed row `{row}` (an alias, or empty for bare columns).
fn passed(backend: Backend, row: &str, parts: &Parts) -> String {
    let col = |name: &str| if row.is_empty() { name.to_owned() } else { format!("{row}.{name}") };
    match backend {
        Backend::Sqlite => format!("{} <= {}", col("seq"), parts.seq),
        Backend::Postgres => {
            let visible = |snapshot: &str| format!("pg_visible_in_snapshot({}, CAST({snapshot} AS TEXT)::pg_snapshot)", col("xid"));
            let within_hi = parts.hi.as_ref().map(|hi| {
                format!(
                    " OR ({hi} IS NOT NULL AND {} AND (CAST(CAST({} AS TEXT) AS BIGINT), {}) <= ({}, {}))",
                    visible(hi),
                    col("xid"),
                    col("seq"),
                    parts.xid,
                    parts.seq
                )
            });
            format!("({}{})", visible(&parts.lo), within_hi.unwrap_or_default())
        }
    }
}

/// Statuses a row keeps while the relay owes it: passed by the cursor, they
/// read as delivered.
fn owed(row: &str) -> String {
    let col = if row.is_empty() { "status".to_owned() } else { format!("{row}.status") };
    format!("{col} IN ('{PENDING}', '{RETRYABLE_FAILED}')")
}

/// SQL for the status of row `o` in [`FROM_OUTBOX`] as an operator means it.
pub fn status_sql(backend: Backend) -> String {
    format!(
        "CASE WHEN {} AND s.slice IS NOT NULL AND {} THEN '{DELIVERED}' ELSE o.status END",
        owed("o"),
        passed(backend, "o", &Parts::columns())
    )
}

/// SQL over bare outbox columns: the row is delivered according to
/// `cursors` (taken earlier, e.g. at a rebuild's boundary) or was marked
/// delivered before `before_ms` by an older release.
fn delivered_by(backend: Backend, cursors: &[SliceCursor], before_ms: i64) -> String {
    let mut any = vec![format!("(status = '{DELIVERED}' AND delivered_at_ms < {before_ms})")];
    for c in cursors {
        any.push(format!("(slice = {} AND {} AND {})", c.slice, owed(""), passed(backend, "", &Parts::literal(&c.cursor))));
    }
    format!("({})", any.join(" OR "))
}

/// What was surely delivered at a moment: the rows an older release marked
/// delivered before `before_ms` (database clock) and the rows the cursors
/// read then had passed. A rebuild takes it before reading the topic's end,
/// so every such row's record is below its boundary.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settled {
    pub before_ms: i64,
    pub cursors: Vec<SliceCursor>,
}

impl Settled {
    /// Now, on the database's clock, with every slice's cursor.
    pub async fn now(db: &Db) -> Result<Settled, StoreError> {
        let mut conn = db.pool().acquire().await?;
        let row = sqlx::query(&format!("SELECT {} AS now_ms", db.now_sql())).fetch_one(&mut *conn).await?;
        let before_ms = row.try_get("now_ms")?;
        Ok(Settled { before_ms, cursors: cursors(&mut conn).await? })
    }

    /// SQL over bare outbox columns: the row was delivered by then.
    pub fn outbox_filter(&self, backend: Backend) -> String {
        delivered_by(backend, &self.cursors, self.before_ms)
    }
}

/// SQL over bare outbox columns of one slice: the rows `cursor` has not
/// passed — the range the relay still has to read, which is where a backlog
/// is. On PostgreSQL it starts with the `xmin` bound, so it is a range scan
/// of the `(slice, xid, seq)` index whatever the outbox holds behind it.
pub fn not_passed(backend: Backend, cursor: &Cursor) -> String {
    match backend {
        Backend::Sqlite => format!("seq > {}", cursor.seq),
        Backend::Postgres => {
            let lo = quote(&cursor.lo);
            format!("xid >= pg_snapshot_xmin(CAST({lo} AS pg_snapshot)) AND NOT {}", passed(backend, "", &Parts::literal(cursor)))
        }
    }
}

/// Rows of `status` as [`status_sql`] derives it.
pub async fn count(db: &Db, status: &str) -> Result<i64, StoreError> {
    count_where(db, "=", status).await
}

/// Rows whose derived status is anything but `status`.
pub async fn count_except(db: &Db, status: &str) -> Result<i64, StoreError> {
    count_where(db, "<>", status).await
}

async fn count_where(db: &Db, comparison: &str, status: &str) -> Result<i64, StoreError> {
    let sql = format!("SELECT COUNT(*) AS n FROM {FROM_OUTBOX} WHERE {} {comparison} $1", status_sql(db.backend()));
    let row = sqlx::query(&sql).bind(status).fetch_one(db.pool()).await?;
    Ok(row.try_get("n")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_moves_to_the_next_step_only_when_one_is_done() {
        let c = Cursor { lo: "1:1:".into(), hi: Some("5:9:7".into()), xid: 6, seq: 10 };
        assert_eq!(c.after(Some((8, 20)), false), Cursor { lo: "1:1:".into(), hi: Some("5:9:7".into()), xid: 8, seq: 20 });
        assert_eq!(c.after(None, false), c, "nothing done, nothing moves");
        assert_eq!(c.after(Some((8, 20)), true), Cursor { lo: "5:9:7".into(), hi: None, xid: 0, seq: 0 });
        // SQLite: no snapshots, the sequence is the cursor.
        let s = Cursor { lo: "1:1:".into(), hi: None, xid: 0, seq: 10 };
        assert_eq!(s.after(Some((0, 20)), true), Cursor { lo: "1:1:".into(), hi: None, xid: 0, seq: 20 });
    }

    #[test]
    fn literal_cursors_are_quoted_and_the_step_only_counts_with_a_hi() {
        let c = Cursor { lo: "1:1:".into(), hi: None, xid: 0, seq: 7 };
        assert_eq!(passed(Backend::Sqlite, "", &Parts::literal(&c)), "seq <= 7");
        assert_eq!(not_passed(Backend::Sqlite, &c), "seq > 7");
        assert!(!not_passed(Backend::Postgres, &c).contains("<= ("), "no step under way: only the lo snapshot counts");
        let odd = Cursor { lo: "1:1:'".into(), hi: Some("5:9:".into()), xid: 6, seq: 10 };
        let sql = passed(Backend::Postgres, "", &Parts::literal(&odd));
        assert!(sql.contains("'1:1:'''"), "{sql}");
        assert!(sql.contains("<= (6, 10)"), "{sql}");
    }
}
