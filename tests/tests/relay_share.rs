//! A relay that holds a quarter of the slices reads four times the rows per
//! batch (`RelayConfig::batch_for`), so its produce requests stay as large
//! as one relay's alone. Another owner holds the other twelve slices under a
//! long lease; every slice gets the same backlog; the relay must drain its
//! four slices' rows in one batch each.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use herald_envelope::OutboxEvent;
use herald_kafka::{EmbeddedKafka, KafkaConfig};
use herald_relay::{Relay, RelayConfig, RelayCounters, claims};
use herald_store::{Db, outbox};
use herald_testkit::wait_until;
use tokio_util::sync::CancellationToken;

const BATCH: i64 = 10;
const ROWS_PER_SLICE: usize = 40;

fn event(topic: &str, key: &str) -> OutboxEvent {
    OutboxEvent {
        id: uuid::Uuid::now_v7().to_string(),
        source: "/herald/tests/relay-share".to_owned(),
        event_type: "herald.test.event".to_owned(),
        subject: key.to_owned(),
        time: Utc::now(),
        schema_file: "test.avsc".to_owned(),
        data: vec![b'x'; 50],
        content_type: herald_envelope::AVRO_CONTENT_TYPE.to_owned(),
        extensions: Default::default(),
        topic: topic.to_owned(),
        partition_key: key.to_owned(),
        trace: None,
    }
}

/// `ROWS_PER_SLICE` rows in every slice, in one transaction.
async fn backlog_in_every_slice(db: &Db, topic: &str) -> anyhow::Result<()> {
    let mut per_slice: BTreeMap<i32, usize> = BTreeMap::new();
    let mut tx = db.begin().await?;
    let mut n = 0;
    while per_slice.len() < claims::SLICES as usize || per_slice.values().any(|&c| c < ROWS_PER_SLICE) {
        let key = format!("key-{n}");
        n += 1;
        let count = per_slice.entry(outbox::slice_of(&key)).or_default();
        if *count < ROWS_PER_SLICE {
            *count += 1;
            outbox::append(&mut tx, &event(topic, &key)).await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_holding_four_slices_reads_four_batches_worth_at_once_postgres() -> anyhow::Result<()> {
    let topic = herald_testkit::unique("share");
    let kafka = EmbeddedKafka::start(1, &[&topic], 4)?;
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let other = claims::claim(&db, "other-relay", 600_000, 12).await?;
    assert_eq!(other.len(), 12, "the other owner holds twelve slices");
    backlog_in_every_slice(&db, &topic).await?;

    let config = RelayConfig { owner: "quarter".to_owned(), batch_size: BATCH, ..RelayConfig::default() };
    let relay = Relay::new(db.clone(), &KafkaConfig::new(kafka.bootstrap_servers()), config)?;
    let counters = relay.counters();
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { relay.run(stop).await }
    });
    let mine = 4 * ROWS_PER_SLICE as u64;
    wait_until("the relay's four slices delivered", Duration::from_secs(60), || async {
        Ok(RelayCounters::get(&counters.delivered) >= mine)
    })
    .await?;
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), task).await??;

    assert_eq!(RelayCounters::get(&counters.delivered), mine, "only its own slices");
    // Holding 4 of 16 slices, a batch is 4 × BATCH = 40 rows: one per slice.
    // At BATCH rows a batch it would have taken sixteen.
    assert_eq!(RelayCounters::get(&counters.batches), 4, "one batch per slice");
    assert_eq!(RelayCounters::get(&counters.backlog_batches), 4, "each a full batch: the backlog's producer");
    Ok(())
}
