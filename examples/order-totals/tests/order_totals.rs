//! The example end to end, on both databases and the shared Apache Kafka
//! cluster: the shop's events appended through the outbox contract (the SQL
//! function on PostgreSQL, the documented INSERT on SQLite), relayed with a
//! route by type, applied live by the user's projection — a republished
//! duplicate counted once, data that does not fit dead-lettered — and then
//! rebuilt into generation 2, which verifies against generation 1 and
//! takes over reads.

use std::time::Duration;

use cloudevents::binding::rdkafka::FutureRecordExt;
use herald_consumer::{Live, Metrics, Projection, Subscription, SubscriptionOptions};
use herald_envelope::{JSON_CONTENT_TYPE, OutboxEvent, Registry, Sources};
use herald_kafka::{KafkaConfig, TopicSettings};
use herald_rebuild::replay::ReplayProgress;
use herald_rebuild::{Progress, RebuildOptions, verify};
use herald_relay::{Relay, RelayConfig, Routes};
use herald_store::{Backend, Db};
use herald_testkit::{TestDb, unique, wait_until};
use order_totals::{OrderTotals, PLACED, REFUNDED, SOURCE};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::Row;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(90);

struct Quiet;

impl Progress for Quiet {
    fn phase(&mut self, _: &str) {}
    fn replayed(&mut self, _: ReplayProgress) {}
}

/// What the shop service does: its event, in its own transaction, through
/// the contract.
async fn append(db: &Db, id: &str, event_type: &str, order_id: &str, data: &str) -> anyhow::Result<()> {
    let mut tx = db.begin().await?;
    match db.backend() {
        Backend::Postgres => {
            sqlx::query(
                "SELECT 1 AS appended FROM herald.append_event(source => $1, id => $2, type => $3, subject => $4, \
                 partition_key => $4, data => convert_to($5, 'UTF8'), content_type => 'application/json')",
            )
            .bind(SOURCE)
            .bind(id)
            .bind(event_type)
            .bind(order_id)
            .bind(data)
            .fetch_one(&mut *tx)
            .await?;
        }
        Backend::Sqlite => {
            let now = herald_store::now_ms();
            sqlx::query(&herald_testkit::docs::block("docs/outbox-contract.md", "sql", "INSERT INTO outbox")?)
                .bind(id)
                .bind(SOURCE)
                .bind(event_type)
                .bind(order_id)
                .bind(now)
                .bind(None::<String>)
                .bind(data.as_bytes().to_vec())
                .bind(order_id)
                .bind(now)
                .bind(herald_store::outbox::slice_of(order_id))
                .bind(JSON_CONTENT_TYPE)
                .bind(None::<String>)
                .execute(&mut *tx)
                .await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

/// A record the relay published twice (an acknowledgement lost): the same
/// CloudEvent again, produced straight to the topic.
async fn republish(producer: &FutureProducer, topic: &str, id: &str, order_id: &str, data: &str) -> anyhow::Result<()> {
    let event = OutboxEvent {
        id: id.to_owned(),
        source: SOURCE.to_owned(),
        event_type: PLACED.to_owned(),
        subject: order_id.to_owned(),
        time: chrono::Utc::now(),
        schema_file: String::new(),
        data: data.as_bytes().to_vec(),
        content_type: JSON_CONTENT_TYPE.to_owned(),
        extensions: Default::default(),
        topic: topic.to_owned(),
        partition_key: order_id.to_owned(),
        trace: None,
    };
    let message = event.to_kafka_record()?;
    let record = FutureRecord::to(topic).key(order_id).message_record(&message);
    producer.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| e)?;
    Ok(())
}

async fn dead_letters(db: &Db) -> anyhow::Result<i64> {
    let row =
        sqlx::query("SELECT COUNT(*) AS n FROM dead_letters WHERE subscription = $1").bind(OrderTotals::NAME).fetch_one(db.pool()).await?;
    Ok(row.try_get("n")?)
}

async fn order_totals_live_and_rebuilt(test_db: TestDb) -> anyhow::Result<()> {
    let db = Db::connect_and_migrate(&test_db.url).await?;
    order_totals::install(&db).await?;
    let brokers = herald_testkit::real_broker()?;
    let kafka = KafkaConfig::new(&brokers);
    let topic = unique("shop-orders");
    herald_kafka::ensure_topics(&kafka, &[topic.as_str()], TopicSettings::partitions(2)).await?;

    let stop = CancellationToken::new();
    let routes = Routes::parse(&[format!("shop.order.*={topic}")], "unused-default")?;
    let relay = Relay::new(db.clone(), &kafka, RelayConfig { owner: unique("relay"), routes, ..RelayConfig::default() })?;
    let relaying = tokio::spawn({
        let stop = stop.clone();
        async move { relay.run(stop).await }
    });
    let subscription = Subscription::new(OrderTotals::NAME, &unique("herald"), &kafka, &[topic.as_str()]);
    let registry = Registry::embedded().accepting(Sources::new([SOURCE.to_owned()])?);
    let options = SubscriptionOptions { registry: registry.clone(), max_attempts: 2, ..SubscriptionOptions::default() };
    let live = tokio::spawn({
        let (db, stop, topic) = (db.clone(), stop.clone(), topic.clone());
        async move {
            let live = Live::new(OrderTotals, &topic);
            herald_consumer::run_subscription(&subscription, &db, &live, &options, &Metrics::default(), stop).await
        }
    });

    let run = unique("o");
    let placed = |n: usize, customer: &str, cents: i64| {
        (format!("{run}-placed-{n}"), format!(r#"{{"order_id":"{run}-{n}","customer":"{customer}","total_cents":{cents}}}"#))
    };
    for (n, customer, cents) in [(1, "alice", 100), (2, "alice", 200), (3, "bob", 50), (4, "alice", 300)] {
        let (id, data) = placed(n, customer, cents);
        append(&db, &id, PLACED, &format!("{run}-{n}"), &data).await?;
    }
    let refund = format!(r#"{{"order_id":"{run}-2","customer":"alice","refunded_cents":100}}"#);
    append(&db, &format!("{run}-refunded-2"), REFUNDED, &format!("{run}-2"), &refund).await?;
    // Valid JSON that is not an order: the subscription dead-letters it.
    append(&db, &format!("{run}-placed-bad"), PLACED, &format!("{run}-bad"), r#"{"order_id":"x"}"#).await?;
    let (id, data) = placed(1, "alice", 100);
    let producer: FutureProducer = kafka.producer().create()?;
    republish(&producer, &topic, &id, &format!("{run}-1"), &data).await?;

    let settled = || async {
        let alice = order_totals::totals_of(&db, "alice").await?;
        let bob = order_totals::totals_of(&db, "bob").await?;
        Ok(alice == Some((3, 500)) && bob == Some((1, 50)) && dead_letters(&db).await? == 1)
    };
    wait_until("alice 3 orders/500, bob 1/50, one dead letter", WAIT, settled).await?;

    let options = RebuildOptions { kafka: kafka.clone(), topic: topic.clone(), batch: 3, registry, ..RebuildOptions::default() };
    let report = herald_rebuild::rebuild::rebuild(&db, &OrderTotals, &options, &mut Quiet, &CancellationToken::new()).await?;
    assert_eq!((report.generation, report.state.as_str(), report.switched), (2, "active", true), "{report:?}");
    let (one, two) = verify::fingerprints(&db, &OrderTotals, 1, 2).await?;
    assert_eq!(one, two);
    assert_eq!(herald_store::generations::active(&db, OrderTotals::NAME).await?, 2);
    assert_eq!(order_totals::totals_of(&db, "alice").await?, Some((3, 500)), "generation 2 counts the duplicate once too");

    stop.cancel();
    live.await??;
    relaying.await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn order_totals_live_and_rebuilt_postgres() -> anyhow::Result<()> {
    order_totals_live_and_rebuilt(herald_testkit::postgres_db().await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn order_totals_live_and_rebuilt_sqlite() -> anyhow::Result<()> {
    order_totals_live_and_rebuilt(herald_testkit::sqlite_db()?).await
}
