//! One small batch at a time, each its own short transaction, so a prune
//! never holds locks or a snapshot long enough to slow the relay or the
//! consumers: the tables herald-store owns (outbox, inbox, dead letters).

use sqlx::Row;

use crate::dead_letter::{DISCARDED, REDRIVEN};
use crate::delivered::{self, FROM_OUTBOX};
use crate::outbox::{DEAD_LETTERED, DELIVERED, FAILED, placeholders};
use crate::{Backend, Db, StoreError};

/// What one batch removed and whether to call again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    pub removed: u64,
    /// Where the next batch starts; `None`: nothing older is left.
    pub next: Option<i64>,
}

impl Batch {
    /// A batch of a `LIMIT`ed delete: a full one may have left more.
    pub fn limited(removed: u64, limit: i64) -> Batch {
        Batch { removed, next: (removed >= limit.unsigned_abs()).then_some(0) }
    }
}

/// Delivered outbox rows older than `before_ms`, in the window of `window`
/// rows after sequence `after`. A row is dated by `delivered_at_ms` where an
/// older release wrote it, and otherwise — the relay's cursor passed it (see
/// [`crate::delivered`]) — by `created_at_ms`: both are at or after the
/// event's time, which is what the horizons rely on. The outbox is walked in
/// sequence order by its primary key: no index on the status or a time is
/// needed, pending and set-aside rows are stepped over and stay, and the
/// walk stops at the first window that ends in a row created after the
/// cutoff (later rows are later still).
pub async fn outbox(db: &Db, before_ms: i64, after: i64, window: i64) -> Result<Batch, StoreError> {
    let sql = format!(
        "SELECT o.seq, {} AS status, o.delivered_at_ms, o.created_at_ms FROM {FROM_OUTBOX} WHERE o.seq > $1 ORDER BY o.seq LIMIT $2",
        delivered::status_sql(db.backend())
    );
    let rows = sqlx::query(&sql).bind(after).bind(window).fetch_all(db.pool()).await?;
    let mut seen = Vec::with_capacity(rows.len());
    for row in &rows {
        let status: String = row.try_get("status")?;
        let created_at_ms: i64 = row.try_get("created_at_ms")?;
        let delivered_at: Option<i64> = row.try_get("delivered_at_ms")?;
        seen.push(Seen {
            seq: row.try_get("seq")?,
            doomed: status == DELIVERED && delivered_at.unwrap_or(created_at_ms) < before_ms,
            created_at_ms,
        });
    }
    let (doomed, next) = walk(&seen, before_ms);
    let removed = delete_seqs(db, &doomed).await?;
    Ok(Batch { removed, next })
}

/// A row of an outbox window as the walk sees it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    seq: i64,
    doomed: bool,
    created_at_ms: i64,
}

/// The rows of a window to remove, and where the next window starts.
fn walk(window: &[Seen], before_ms: i64) -> (Vec<i64>, Option<i64>) {
    let doomed = window.iter().filter(|r| r.doomed).map(|r| r.seq).collect();
    let next = match window.last() {
        Some(last) if last.created_at_ms < before_ms => Some(last.seq),
        _ => None,
    };
    (doomed, next)
}

async fn delete_seqs(db: &Db, seqs: &[i64]) -> Result<u64, StoreError> {
    if seqs.is_empty() {
        return Ok(0);
    }
    if db.backend() == Backend::Postgres {
        let list = seqs.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        // Re-checked: never a row set aside (a cursor only moves forward, so
        // a row it passed stays passed).
        let done = sqlx::query("DELETE FROM outbox WHERE seq = ANY(CAST($1 AS TEXT)::BIGINT[]) AND status NOT IN ($2, $3)")
            .bind(format!("{{{list}}}"))
            .bind(FAILED)
            .bind(DEAD_LETTERED)
            .execute(db.pool())
            .await?;
        return Ok(done.rows_affected());
    }
    let mut removed = 0;
    for chunk in seqs.chunks(500) {
        let sql = format!("DELETE FROM outbox WHERE status NOT IN ($1, $2) AND seq IN ({})", placeholders(3, chunk.len()));
        let mut query = sqlx::query(&sql).bind(FAILED).bind(DEAD_LETTERED);
        for seq in chunk {
            query = query.bind(*seq);
        }
        removed += query.execute(db.pool()).await?.rows_affected();
    }
    Ok(removed)
}

/// Up to `limit` inbox rows processed before `before_ms` (of `subscription`
/// only, if given), oldest first, by the `inbox_by_age` index.
pub async fn inbox(db: &Db, before_ms: i64, subscription: Option<&str>, limit: i64) -> Result<Batch, StoreError> {
    let only = if subscription.is_some() { " AND subscription = $3" } else { "" };
    let sql = format!(
        "DELETE FROM inbox WHERE (subscription, source, event_id) IN (SELECT subscription, source, event_id FROM inbox \
         WHERE processed_at_ms < $1{only} ORDER BY processed_at_ms LIMIT $2)"
    );
    let mut query = sqlx::query(&sql).bind(before_ms).bind(limit);
    if let Some(subscription) = subscription {
        query = query.bind(subscription);
    }
    Ok(Batch::limited(query.execute(db.pool()).await?.rows_affected(), limit))
}

/// Up to `limit` dead letters redriven or discarded before `before_ms`: an
/// operator has settled them. Letters still `dead` wait for a decision and
/// are never pruned.
pub async fn dead_letters(db: &Db, before_ms: i64, limit: i64) -> Result<Batch, StoreError> {
    let done = sqlx::query(
        "DELETE FROM dead_letters WHERE id IN (SELECT id FROM dead_letters WHERE status IN ($1, $2) AND updated_at_ms < $3 LIMIT $4)",
    )
    .bind(REDRIVEN)
    .bind(DISCARDED)
    .bind(before_ms)
    .bind(limit)
    .execute(db.pool())
    .await?;
    Ok(Batch::limited(done.rows_affected(), limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(seq: i64, doomed: bool, created_at_ms: i64) -> Seen {
        Seen { seq, doomed, created_at_ms }
    }

    #[test]
    fn a_window_removes_old_delivered_rows_and_steps_over_the_rest() {
        let window = [seen(1, true, 10), seen(2, false, 11), seen(3, true, 12)];
        assert_eq!(walk(&window, 100), (vec![1, 3], Some(3)));
    }

    #[test]
    fn the_walk_stops_at_a_window_ending_after_the_cutoff_or_at_the_end() {
        let window = [seen(1, true, 10), seen(2, false, 200)];
        assert_eq!(walk(&window, 100), (vec![1], None));
        assert_eq!(walk(&[], 100), (vec![], None));
    }
}
