//! A slice with a backlog sends its full batches through the relay's
//! producer that lingers to fill requests, and what is left (a partial
//! batch: the slice caught up) through the one that sends at once; a key's
//! records stay in commit order across the switch, on both databases, and
//! with two batches in flight (the partial batch waits until the full one
//! before it is acknowledged: sent at once, it would overtake it, its
//! producer lingering 5 ms against 50).

mod relay_support;

use herald_relay::RelayConfig;
use relay_support::{assert_commit_order, bench, config, stat};

async fn a_backlog_goes_through_the_lingering_producer_in_order(postgres: bool, in_flight: usize) -> anyhow::Result<()> {
    let b = bench(postgres).await?;
    let keys: Vec<String> = (0..111).map(|i| format!("backlog-{}", i % 3)).collect();
    let ids = b.append(&keys.iter().map(String::as_str).collect::<Vec<_>>()).await?;
    let relay = b.start(RelayConfig { batch_size: 10, in_flight, ..config("backlog") })?;
    b.wait_count(&b.delivered(), 111).await?;
    let stats = relay.stats.clone();
    relay.stop().await?;

    let (backlog, sent) = (stat(&stats.backlog_batches), stat(&stats.sent));
    assert!(backlog >= 3, "full batches went through the lingering producer: {backlog}");
    assert!(sent > backlog * 10, "the rest went through the other producer: {sent} sent, {backlog} full batches");
    assert_commit_order(&keys, &ids, &b.records()?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backlog_goes_through_the_lingering_producer_in_order_postgres() -> anyhow::Result<()> {
    a_backlog_goes_through_the_lingering_producer_in_order(true, 1).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backlog_goes_through_the_lingering_producer_in_order_sqlite() -> anyhow::Result<()> {
    a_backlog_goes_through_the_lingering_producer_in_order(false, 1).await
}

#[tokio::test(flavor = "multi_thread")]
async fn two_batches_in_flight_switch_producers_in_order_postgres() -> anyhow::Result<()> {
    a_backlog_goes_through_the_lingering_producer_in_order(true, 2).await
}

#[tokio::test(flavor = "multi_thread")]
async fn two_batches_in_flight_switch_producers_in_order_sqlite() -> anyhow::Result<()> {
    a_backlog_goes_through_the_lingering_producer_in_order(false, 2).await
}
