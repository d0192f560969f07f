//! Nothing waits on a poll interval when work is there (issue 20): a row
//! committed while every slice of the relay is idle is published without
//! waiting for the next poll. PostgreSQL wakes the slice with the outbox
//! trigger's NOTIFY; SQLite, which has none, with the news of this
//! process's commits (`herald_store::outbox::announce`). The relays under
//! test poll once an hour, so only a wake-up can deliver within the test.

mod relay_support;

use std::time::Duration;

use herald_relay::claims::SLICES;
use herald_store::outbox;
use relay_support::{RelayConfig, bench, config, stat, wait_until};

/// Polls so rarely that a row found by polling would time the test out.
fn hourly(owner: &str) -> RelayConfig {
    RelayConfig { idle_min: Duration::from_secs(3600), idle_max: Duration::from_secs(3600), ..config(owner) }
}

async fn a_commit_wakes_an_idle_relay(postgres: bool) -> anyhow::Result<()> {
    let bench = bench(postgres).await?;
    let relay = bench.start(hourly("waker"))?;
    // Gate: every slice has read the empty outbox once and gone idle (and,
    // on PostgreSQL, the listener is connected), so the row below can only
    // be found by a wake-up.
    wait_until("every slice idle", || async {
        let listening = !postgres || stat(&relay.stats.listening) == 1;
        Ok(listening && stat(&relay.stats.idle) >= SLICES as u64)
    })
    .await?;
    let event = bench.event("order-7", b"payload");
    let mut tx = bench.db.begin().await?;
    outbox::append(&mut tx, &event).await?;
    tx.commit().await?;
    outbox::announce(&bench.db, [event.partition_key.as_str()]);
    bench.wait_count(&bench.delivered(), 1).await?;
    let records = bench.records()?;
    assert_eq!(records.len(), 1, "the one row, published once");
    relay.stop().await
}

#[tokio::test]
async fn a_commit_wakes_an_idle_relay_sqlite() -> anyhow::Result<()> {
    a_commit_wakes_an_idle_relay(false).await
}

#[tokio::test]
async fn a_commit_wakes_an_idle_relay_postgres() -> anyhow::Result<()> {
    a_commit_wakes_an_idle_relay(true).await
}
