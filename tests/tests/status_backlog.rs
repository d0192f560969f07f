//! The status monitor's outbox figures are read from behind each slice's
//! relay cursor and from `outbox_set_aside`, never by scanning the outbox
//! (issue 19). They must equal the plain `GROUP BY status` over the whole
//! table in every state a real relay leaves behind: slices stopped in the
//! middle of a step, rows committed after the cursor, rows set aside and
//! redriven. Both databases, the mock cluster, states made by a relay
//! stopped at an injected gate.

mod relay_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use herald_fault::{Action, Hook, Point};
use herald_relay::RelayConfig;
use herald_status::counting::Reading;
use herald_status::queries;
use herald_store::{Db, outbox};
use herald_testkit::Gate;
use relay_support::{Bench, bench, config, wait_until, with_faults};
use sqlx::Row;

/// `(status → rows, oldest backlog created_at)` over the whole outbox.
async fn scanned(db: &Db) -> anyhow::Result<(BTreeMap<String, i64>, Option<i64>)> {
    let mut by_status = BTreeMap::new();
    // Every row with its status derived from the cursors, the slow way.
    let derived = format!(
        "SELECT {} AS status, o.created_at_ms FROM {}",
        herald_store::delivered::status_sql(db.backend()),
        herald_store::delivered::FROM_OUTBOX
    );
    let sql = format!("SELECT status, COUNT(*) AS n FROM ({derived}) AS rows_now WHERE status <> 'delivered' GROUP BY status");
    for r in sqlx::query(&sql).fetch_all(db.pool()).await? {
        by_status.insert(r.try_get("status")?, r.try_get("n")?);
    }
    let sql = format!("SELECT MIN(created_at_ms) AS m FROM ({derived}) AS rows_now WHERE status IN ('pending', 'retryable_failed')");
    let oldest = sqlx::query(&sql).fetch_one(db.pool()).await?.try_get("m")?;
    Ok((by_status, oldest))
}

/// The monitor's figures equal the scan's; returns the backlog.
async fn figures_match_a_scan(db: &Db, when: &str) -> anyhow::Result<i64> {
    let now = herald_store::now_ms();
    let mut reading = Reading::begin(db).await?;
    let figures = queries::outbox(&mut reading, now).await?;
    reading.finish().await?;
    let (by_status, oldest) = scanned(db).await?;
    let n = |s: &str| by_status.get(s).copied().unwrap_or(0);
    assert_eq!(
        (figures.pending, figures.retryable_failed, figures.failed, figures.dead_lettered),
        (n(outbox::PENDING), n(outbox::RETRYABLE_FAILED), n(outbox::FAILED), n(outbox::DEAD_LETTERED)),
        "{when}: figures {figures:?}, scan {by_status:?}"
    );
    assert_eq!(figures.oldest_pending_age_ms, oldest.map(|t| (now - t).max(0)), "{when}: oldest of the backlog");
    Ok(figures.backlog)
}

/// At the `nth` progress write, tells the test and waits for it, then loses
/// that batch's acknowledgement (the relay is being stopped): the slices are
/// left wherever their last recorded batch put them.
fn stop_at_progress(nth: usize, reached: Gate, resume: Gate) -> Hook {
    let writes = Arc::new(AtomicUsize::new(0));
    Hook::new(move |site| {
        let stop_here = site.point == Point::BeforeProgress && writes.fetch_add(1, Ordering::SeqCst) + 1 == nth;
        let (reached, resume) = (reached.clone(), resume.clone());
        async move {
            if !stop_here {
                return Action::Continue;
            }
            reached.arrive_and_wait().await;
            resume.arrive_and_wait().await;
            Action::LoseAck
        }
    })
}

async fn append_keys(b: &Bench, rows: usize, prefix: &str) -> anyhow::Result<()> {
    let keys: Vec<String> = (0..rows).map(|i| format!("{prefix}-{}", i % 8)).collect();
    b.append(&keys.iter().map(String::as_str).collect::<Vec<_>>()).await?;
    Ok(())
}

async fn backlog_is_read_behind_the_cursors(postgres: bool) -> anyhow::Result<()> {
    let b = bench(postgres).await?;
    // A record the broker can never take: set aside as `failed`.
    let big = b.event("big", &vec![7u8; 2 * 1024 * 1024]);
    let mut tx = b.db.begin().await?;
    outbox::append(&mut tx, &big).await?;
    tx.commit().await?;
    append_keys(&b, 400, "k").await?;
    assert_eq!(figures_match_a_scan(&b.db, "before any relay").await?, 401);

    // Small batches, so slices stop in the middle of a step.
    let (reached, resume) = (Gate::new(2), Gate::new(2));
    let relay_config = RelayConfig { batch_size: 5, ..config("status") };
    let running = b.start(with_faults(relay_config, stop_at_progress(12, reached.clone(), resume.clone())))?;
    reached.arrive_and_wait().await;
    running.stop.cancel();
    resume.arrive_and_wait().await;
    running.stop().await?;
    append_keys(&b, 30, "after").await?;
    let backlog = figures_match_a_scan(&b.db, "relay stopped mid-way, rows committed after").await?;
    let delivered = b.count(&b.delivered()).await?;
    assert!(backlog > 30 && delivered > 0, "a state in between: backlog {backlog}, delivered {delivered}");

    let running = b.start(config("status"))?;
    b.wait_count(&b.delivered(), 430).await?;
    wait_until("the big row set aside", || async { Ok(b.status_of(&big.id).await?.0 == outbox::FAILED) }).await?;
    running.stop().await?;
    assert_eq!(figures_match_a_scan(&b.db, "drained").await?, 0);

    // A redrive takes the row out of the set-aside list and re-appends it;
    // until a relay fails it again it is backlog.
    let failed: i64 = sqlx::query("SELECT seq FROM outbox WHERE status = 'failed'").fetch_one(b.db.pool()).await?.try_get("seq")?;
    assert_eq!(outbox::redrive(&b.db, &[failed]).await?.len(), 1);
    assert_eq!(figures_match_a_scan(&b.db, "redriven").await?, 1);
    let running = b.start(config("status"))?;
    wait_until("set aside again", || async { Ok(b.status_of(&big.id).await?.0 == outbox::FAILED) }).await?;
    running.stop().await?;
    assert_eq!(figures_match_a_scan(&b.db, "set aside again").await?, 0);
    assert_eq!(queries::collect(&b.db, &[], 0).await?.outbox.failed, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn backlog_is_read_behind_the_cursors_postgres() -> anyhow::Result<()> {
    backlog_is_read_behind_the_cursors(true).await
}

#[tokio::test(flavor = "multi_thread")]
async fn backlog_is_read_behind_the_cursors_sqlite() -> anyhow::Result<()> {
    backlog_is_read_behind_the_cursors(false).await
}
