//! A subscription that starts while its database is unreachable waits for
//! the database, as a running one does, instead of ending: in `herald
//! serve` an ended subscription left its role stopped (readyz 503) in a
//! process that stayed up, and nothing restarted it. CI caught it in
//! `readiness`, where the stats subscription's start-up met the database
//! outage the test makes.
//!
//! The gate is causal: the subscription's connection goes through a proxy
//! that is cut before it starts, and the proxy is healed only after it
//! refused one of the subscription's connections. Before the fix the
//! subscription had returned its error by then and never applied the
//! record published after the heal.

use std::time::Duration;

use herald::bench::workload;
use herald_consumer::{Live, Metrics, SubscriptionOptions};
use herald_kafka::{KafkaConfig, Topics};
use herald_projections::stats::{self, Stats};
use herald_store::Db;
use herald_testkit::{CutProxy, unique, wait_until};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread")]
async fn a_subscription_started_during_a_database_outage_waits_for_it_postgres() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let mut url = url::Url::parse(&test_db.url)?;
    let target = format!("{}:{}", url.host_str().unwrap_or("127.0.0.1"), url.port().unwrap_or(5432)).parse()?;
    let proxy = CutProxy::start(target).await?;
    url.set_port(Some(proxy.addr().port())).map_err(|()| anyhow::anyhow!("url without port"))?;
    let through_proxy = Db::connect(url.as_str()).await?;

    let brokers = herald_testkit::real_broker()?;
    let topics = Topics::with_prefix(&unique("startup"));
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), herald_kafka::TopicSettings::partitions(1)).await?;
    let sub =
        herald_consumer::Subscription::new(stats::SUBSCRIPTION, &unique("herald"), &KafkaConfig::new(&brokers), &[topics.events.as_str()]);

    proxy.cut();
    let stop = CancellationToken::new();
    let running = {
        let (db, stop, topic) = (through_proxy.clone(), stop.clone(), topics.events.clone());
        tokio::spawn(async move {
            herald_consumer::run_subscription(
                &sub,
                &db,
                &Live::new(Stats, &topic),
                &SubscriptionOptions::default(),
                &Metrics::default(),
                stop,
            )
            .await
        })
    };
    wait_until("the subscription to try the database while it is cut off", Duration::from_secs(60), || async { Ok(proxy.refused() > 0) })
        .await?;
    proxy.heal();

    let events = workload::completions(&topics.events, &unique("run"), 1)?;
    workload::publish(&workload::producer(&KafkaConfig::new(&brokers))?, &events).await?;
    let applied = wait_until("the record published after the outage to be applied", Duration::from_secs(90), || async {
        anyhow::ensure!(!running.is_finished(), "the subscription ended during the outage");
        Ok(stats::total_exports(&db).await? == 1)
    })
    .await;
    stop.cancel();
    let ended = running.await?;
    applied?;
    ended?;
    Ok(())
}
