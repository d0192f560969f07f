//! Claims, leases and fenced cursors of the relay.
//!
//! The claim is over a *slice* of the key space, not over single rows: every
//! row carries `slice = hash(partition_key) mod SLICES`, one relay at a time
//! holds a slice under a lease (owner, token, claimed at, expires at, attempt
//! count — seed 004's fields), and reads it forward from a cursor stored with
//! the claim. All rows of a key are in one slice, so the lease holder alone
//! orders them. Progress — the cursor and the rows' final statuses — is
//! written in one transaction that first checks the token and the expiry: a
//! relay that lost its lease cannot write progress.
//!
//! Reading forward must not skip a row whose transaction commits late. On
//! PostgreSQL the cursor is a pair of snapshots: rows visible in `hi` but not
//! in `lo` are exactly the rows committed between the two, whatever their
//! sequence numbers, and a row committing after `hi` falls into a later step.
//! Within a step rows go in (transaction id, sequence) order — one range scan
//! of the `(slice, xid, seq)` index from the cursor. On SQLite the single
//! writer commits in sequence order, so the sequence alone is the cursor.

use sqlx::Row;
use sqlx::any::AnyRow;

use crate::outbox::placeholders;
use crate::outbox::{self, OutboxRow, ROW_COLUMNS};
use crate::{Backend, Db, StoreError};

/// Number of slices. Fixed: a row's slice is computed when it is written,
/// so changing this reorders keys in flight (drain the relays first).
pub const SLICES: i32 = 16;

/// The slice of a partition key: FNV-1a, stable across processes, versions
/// and platforms (unlike `std`'s hasher, which is seeded).
pub fn slice_of(partition_key: &str) -> i32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in partition_key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % SLICES as u64) as i32
}

/// Where a slice's reading stands. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
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
}

/// A held lease on one slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub slice: i32,
    pub owner: String,
    pub token: String,
    pub attempt_count: i64,
    pub cursor: Cursor,
}

/// Claims up to `max` slices whose lease is free or expired, for `ttl_ms`.
///
/// PostgreSQL: `FOR UPDATE SKIP LOCKED` in one `UPDATE … RETURNING`, so two
/// relays claiming at once get disjoint slices. SQLite: the same statement
/// under its single writer.
pub async fn claim(db: &Db, owner: &str, ttl_ms: i64, max: i64) -> Result<Vec<Claim>, StoreError> {
    if max <= 0 {
        return Ok(Vec::new());
    }
    let now = db.now_sql();
    let lock = if db.backend() == Backend::Postgres { "FOR UPDATE SKIP LOCKED" } else { "" };
    let token = uuid_like();
    let sql = format!(
        "UPDATE relay_slices SET claim_owner = $1, claim_token = $2 || '-' || CAST(slice AS TEXT), \
         claimed_at_ms = {now}, claim_expires_at_ms = {now} + $3, \
         claim_attempt_count = claim_attempt_count + 1 \
         WHERE slice IN (SELECT slice FROM relay_slices WHERE claim_expires_at_ms <= {now} \
         ORDER BY slice LIMIT $4 {lock}) \
         RETURNING slice, claim_owner, claim_token, claim_attempt_count, cursor_lo, cursor_hi, cursor_xid, cursor_seq"
    );
    let rows = sqlx::query(&sql).bind(owner).bind(token).bind(ttl_ms).bind(max).fetch_all(db.pool()).await?;
    rows.iter().map(row_to_claim).collect()
}

fn row_to_claim(row: &AnyRow) -> Result<Claim, StoreError> {
    Ok(Claim {
        slice: row.try_get("slice")?,
        owner: row.try_get("claim_owner")?,
        token: row.try_get("claim_token")?,
        attempt_count: row.try_get("claim_attempt_count")?,
        cursor: Cursor {
            lo: row.try_get("cursor_lo")?,
            hi: row.try_get("cursor_hi")?,
            xid: row.try_get("cursor_xid")?,
            seq: row.try_get("cursor_seq")?,
        },
    })
}

/// A fresh random token; the claim token must differ between two claims of
/// the same owner name (a restarted process reuses its name).
fn uuid_like() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

/// Extends the leases behind `tokens` that are still held and unexpired;
/// returns the tokens that were extended. A token not returned is lost.
pub async fn renew(db: &Db, tokens: &[String], ttl_ms: i64) -> Result<Vec<String>, StoreError> {
    if tokens.is_empty() {
        return Ok(Vec::new());
    }
    let now = db.now_sql();
    let sql = format!(
        "UPDATE relay_slices SET claim_expires_at_ms = {now} + $1 \
         WHERE claim_expires_at_ms > {now} AND claim_token IN ({}) RETURNING claim_token",
        placeholders(2, tokens.len())
    );
    let mut query = sqlx::query(&sql).bind(ttl_ms);
    for token in tokens {
        query = query.bind(token);
    }
    let rows = query.fetch_all(db.pool()).await?;
    rows.iter().map(|r| Ok(r.try_get("claim_token")?)).collect()
}

/// Gives a slice back (graceful shutdown, rebalancing). The cursor stays:
/// the next holder goes on from the last progress written.
pub async fn release(db: &Db, token: &str) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE relay_slices SET claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = 0 \
         WHERE claim_token = $1",
    )
    .bind(token)
    .execute(db.pool())
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records that `owner` is alive until `ttl_ms` from now; returns how many
/// relays are alive, this one included, so each can take its share.
pub async fn heartbeat(db: &Db, owner: &str, ttl_ms: i64) -> Result<i64, StoreError> {
    let now = db.now_sql();
    sqlx::query(&format!(
        "INSERT INTO relay_members (owner, expires_at_ms) VALUES ($1, {now} + $2) \
         ON CONFLICT (owner) DO UPDATE SET expires_at_ms = excluded.expires_at_ms"
    ))
    .bind(owner)
    .bind(ttl_ms)
    .execute(db.pool())
    .await?;
    sqlx::query(&format!("DELETE FROM relay_members WHERE expires_at_ms < {now} - 60000")).execute(db.pool()).await?;
    let row = sqlx::query(&format!("SELECT COUNT(*) AS n FROM relay_members WHERE expires_at_ms > {now}")).fetch_one(db.pool()).await?;
    Ok(row.try_get::<i64, _>("n")?.max(1))
}

/// Removes `owner` from the live relays (graceful shutdown).
pub async fn leave(db: &Db, owner: &str) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM relay_members WHERE owner = $1").bind(owner).execute(db.pool()).await?;
    Ok(())
}

/// Reads up to `limit` rows of `slice` after `cursor`, in order. On
/// PostgreSQL a cursor without `hi` first gets the current snapshot as `hi`
/// (returned in the updated cursor).
pub async fn read(db: &Db, slice: i32, cursor: &Cursor, limit: i64) -> Result<(Vec<OutboxRow>, Cursor), StoreError> {
    let live = format!("status IN ('{}', '{}')", outbox::PENDING, outbox::RETRYABLE_FAILED);
    if db.backend() == Backend::Sqlite {
        let sql = format!("SELECT {ROW_COLUMNS} FROM outbox WHERE slice = $1 AND seq > $2 AND {live} ORDER BY seq LIMIT $3");
        let rows = sqlx::query(&sql).bind(slice).bind(cursor.seq).bind(limit).fetch_all(db.pool()).await?;
        return Ok((rows.iter().map(outbox::row_to_outbox).collect::<Result<_, _>>()?, cursor.clone()));
    }
    let mut cursor = cursor.clone();
    let hi = match &cursor.hi {
        Some(hi) => hi.clone(),
        None => {
            let row = sqlx::query("SELECT CAST(pg_current_snapshot() AS TEXT) AS hi").fetch_one(db.pool()).await?;
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
    let rows =
        sqlx::query(&sql).bind(slice).bind(&cursor.lo).bind(&hi).bind(cursor.xid).bind(cursor.seq).bind(limit).fetch_all(db.pool()).await?;
    Ok((rows.iter().map(outbox::row_to_outbox).collect::<Result<_, _>>()?, cursor))
}

/// What became of a row that was not delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setback {
    pub seq: i64,
    /// [`outbox::RETRYABLE_FAILED`], [`outbox::FAILED`] or [`outbox::DEAD_LETTERED`].
    pub status: &'static str,
    pub error: String,
    /// For a retryable failure: not before this time.
    pub next_attempt_at_ms: Option<i64>,
}

/// Whether a progress write happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Fence {
    /// The token still held the lease: progress recorded, lease extended.
    Held,
    /// The lease expired or another relay took the slice: nothing written.
    Lost,
}

/// Records progress of one batch in one transaction, fenced by the claim:
/// the cursor, `delivered` rows and `setbacks`. Call only with rows whose
/// delivery report succeeded in `delivered`.
pub async fn record_progress(
    db: &Db,
    claim: &Claim,
    cursor: &Cursor,
    delivered: &[i64],
    setbacks: &[Setback],
    ttl_ms: i64,
) -> Result<Fence, StoreError> {
    let now = db.now_sql();
    let mut tx = db.begin().await?;
    // First, and in the same transaction: the fence. On PostgreSQL this also
    // locks the slice row, so a takeover waits for this commit or wins first.
    let fenced = sqlx::query(&format!(
        "UPDATE relay_slices SET cursor_lo = $1, cursor_hi = $2, cursor_seq = $3, cursor_xid = $7, \
         claim_expires_at_ms = {now} + $4, progress_at_ms = {now} \
         WHERE slice = $5 AND claim_token = $6 AND claim_expires_at_ms > {now}"
    ))
    .bind(&cursor.lo)
    .bind(cursor.hi.as_deref())
    .bind(cursor.seq)
    .bind(ttl_ms)
    .bind(claim.slice)
    .bind(&claim.token)
    .bind(cursor.xid)
    .execute(&mut *tx)
    .await?;
    if fenced.rows_affected() != 1 {
        tx.rollback().await?;
        return Ok(Fence::Lost);
    }
    mark_delivered(db, &mut tx, delivered).await?;
    for setback in setbacks {
        sqlx::query(
            "UPDATE outbox SET status = $1, attempts = attempts + 1, last_error = $2, \
             next_attempt_at_ms = $3 WHERE seq = $4",
        )
        .bind(setback.status)
        .bind(&setback.error)
        .bind(setback.next_attempt_at_ms)
        .bind(setback.seq)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(Fence::Held)
}

/// By primary key, and no indexed column changes: HOT updates, no index
/// churn. PostgreSQL gets the keys as one array literal (one parameter, one
/// cached statement, whatever the batch size); SQLite a list of parameters.
async fn mark_delivered(db: &Db, tx: &mut crate::Tx<'_>, seqs: &[i64]) -> Result<(), StoreError> {
    let now = db.now_sql();
    let set = format!("UPDATE outbox SET status = $1, delivered_at_ms = {now}, attempts = attempts + 1, next_attempt_at_ms = NULL");
    if seqs.is_empty() {
        return Ok(());
    }
    if db.backend() == Backend::Postgres {
        let list = seqs.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        sqlx::query(&format!("{set} WHERE seq = ANY(CAST($2 AS TEXT)::BIGINT[])"))
            .bind(outbox::DELIVERED)
            .bind(format!("{{{list}}}"))
            .execute(&mut **tx)
            .await?;
        return Ok(());
    }
    for chunk in seqs.chunks(1000) {
        let sql = format!("{set} WHERE seq IN ({})", placeholders(2, chunk.len()));
        let mut query = sqlx::query(&sql).bind(outbox::DELIVERED);
        for seq in chunk {
            query = query.bind(*seq);
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}

/// The state of every slice, for operators and tests.
pub async fn slices(db: &Db) -> Result<Vec<Claim>, StoreError> {
    let rows = sqlx::query(
        "SELECT slice, COALESCE(claim_owner, '') AS claim_owner, COALESCE(claim_token, '') AS claim_token, \
         claim_attempt_count, cursor_lo, cursor_hi, cursor_xid, cursor_seq FROM relay_slices ORDER BY slice",
    )
    .fetch_all(db.pool())
    .await?;
    rows.iter().map(row_to_claim).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_stable_and_spread() {
        // Pinned values: a change here reorders every deployed outbox.
        assert_eq!(slice_of(""), (0xcbf2_9ce4_8422_2325u64 % 16) as i32);
        let mut seen = [0usize; SLICES as usize];
        for i in 0..1600 {
            seen[slice_of(&format!("key-{i}")) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
        assert_eq!(slice_of("job-42"), slice_of("job-42"));
    }

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
}
