//! The relay's tables: claims on slices of the key space, membership, and
//! the fenced progress write. Leases are the store's one lease primitive
//! ([`herald_store::lease`]) on `relay_slices`; this module adds what only
//! the relay needs.
//!
//! The claim is over a *slice* of the key space, not over single rows: every
//! outbox row carries `slice = hash(partition_key) mod SLICES`, one relay at
//! a time holds a slice under a lease (owner, token, claimed at, expires at,
//! attempt count), and reads it forward from a cursor stored with the claim
//! (see [`crate::cursor`]). All rows of a key are in one slice, so the lease
//! holder alone orders them. Progress — the cursor, and the statuses of the
//! few rows that are exceptions — is written in one transaction that first
//! checks the token and the expiry: a relay that lost its lease cannot write
//! progress.

use herald_store::lease::{Held, LeaseTable, Pick, Take, Token, TokenKind, Value, Write};
use herald_store::{Db, StoreError, outbox};
use sqlx::Row;
use sqlx::any::AnyRow;

pub use crate::cursor::{Cursor, Reader, read};
pub use herald_store::outbox::{SLICES, Setback, slice_of};

/// `relay_slices` as a lease table. A released slice has expiry 0 (the
/// column is NOT NULL), which every later claim sees as expired.
const SLICE_LEASE: LeaseTable = LeaseTable {
    table: "relay_slices",
    key: "slice",
    owner: "claim_owner",
    token: "claim_token",
    expires_at: "claim_expires_at_ms",
    token_kind: TokenKind::Minted,
    released: "0",
};

const CLAIM_COLUMNS: &str = "slice, claim_owner, claim_token, claim_attempt_count, cursor_lo, cursor_hi, cursor_xid, cursor_seq";

/// A held lease on one slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub slice: i32,
    pub owner: String,
    pub token: String,
    pub attempt_count: i64,
    pub cursor: Cursor,
}

impl Claim {
    fn held(&self) -> Held {
        Held { key: Value::from(self.slice), token: Token::Text(self.token.clone()) }
    }
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
    let set = format!("claimed_at_ms = {}, claim_attempt_count = claim_attempt_count + 1", db.now_sql());
    let take = Take {
        owner: Some(owner),
        ttl_ms,
        pick: Pick::First { order_by: "slice", limit: max },
        eligible: None,
        free: None,
        set: Some(set.as_str()),
        returning: CLAIM_COLUMNS,
        binds: 0,
    };
    let statement = SLICE_LEASE.take(db, &take);
    let rows = statement.plain().fetch_all(db.pool()).await?;
    let mut claims = rows.iter().map(row_to_claim).collect::<Result<Vec<_>, _>>()?;
    claims.sort_by_key(|c| c.slice);
    Ok(claims)
}

fn row_to_claim(row: &AnyRow) -> Result<Claim, StoreError> {
    Ok(Claim {
        slice: row.try_get("slice")?,
        owner: row.try_get("claim_owner")?,
        token: row.try_get("claim_token")?,
        attempt_count: row.try_get("claim_attempt_count")?,
        cursor: Cursor::from_row(row)?,
    })
}

/// Extends the leases of `claims` that are still held and unexpired; returns
/// the tokens that were extended. A token not returned is lost.
pub async fn renew(db: &Db, claims: &[Claim], ttl_ms: i64) -> Result<Vec<String>, StoreError> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let held: Vec<Held> = claims.iter().map(Claim::held).collect();
    let statement = SLICE_LEASE.renew_all(db, &held, ttl_ms);
    let rows = statement.plain().fetch_all(db.pool()).await?;
    let kept: Vec<String> = rows.iter().map(|r| r.try_get("leased_key")).collect::<Result<_, _>>()?;
    Ok(claims.iter().filter(|c| kept.contains(&c.slice.to_string())).map(|c| c.token.clone()).collect())
}

/// Gives a slice back (graceful shutdown, rebalancing). The cursor stays:
/// the next holder goes on from the last progress written.
pub async fn release(db: &Db, claim: &Claim) -> Result<bool, StoreError> {
    let done = SLICE_LEASE.release(&claim.held(), None, None, 0).plain().execute(db.pool()).await?;
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
/// the cursor — which says every row it passes is delivered, see
/// [`herald_store::delivered`] — and the exceptions: `setbacks`, and
/// `recovered` rows (delivered after a retryable failure, whose status must
/// no longer say so). Call only with rows whose delivery report succeeded in
/// `recovered`.
pub async fn record_progress(
    db: &Db,
    claim: &Claim,
    cursor: &Cursor,
    recovered: &[i64],
    setbacks: &[Setback],
    ttl_ms: i64,
) -> Result<Fence, StoreError> {
    let mut tx = db.begin().await?;
    // First, and in the same transaction: the fence. On PostgreSQL this also
    // locks the slice row, so a takeover waits for this commit or wins first.
    let set = format!("cursor_lo = $1, cursor_hi = $2, cursor_seq = $3, cursor_xid = $4, progress_at_ms = {}", db.now_sql());
    let write = Write { set: &set, extend_ms: Some(ttl_ms), unexpired: true, binds: 4, ..Write::default() };
    let statement = SLICE_LEASE.write(db, &claim.held(), &write);
    let fenced =
        statement.query(|q| q.bind(&cursor.lo).bind(cursor.hi.as_deref()).bind(cursor.seq).bind(cursor.xid)).execute(&mut *tx).await?;
    if fenced.rows_affected() != 1 {
        tx.rollback().await?;
        return Ok(Fence::Lost);
    }
    outbox::mark_delivered(db, &mut tx, recovered).await?;
    outbox::set_back(&mut tx, setbacks).await?;
    tx.commit().await?;
    Ok(Fence::Held)
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
