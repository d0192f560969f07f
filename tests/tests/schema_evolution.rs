//! Schema evolution on the real broker: v1 and v2 of `export.completed`
//! produced side by side and read by readers of either version; a record
//! whose schema its consumer does not know is dead-lettered and applied once
//! the schema is deployed and the letter redriven.

mod common;

use std::time::{Duration, Instant};

use apache_avro::types::Value as Avro;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::{Schema, to_value};
use chrono::Utc;
use herald::bench::workload;
use herald::subscriptions::{self, Name};
use herald_consumer::Live;
use herald_consumer::{Metrics, Redriven, SubscriptionOptions};
use herald_envelope::data::DEFAULT_CONTENT_TYPE;
use herald_envelope::{DecodedEvent, EventData, ExportCompleted, ExportCompletedV1, OutboxEvent, Registry, decode_record};
use herald_kafka::KafkaConfig;
use herald_kafka::Topics;
use herald_projections::search::{self, Search};
use herald_store::{Db, dead_letter, inbox};
use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use tokio_util::sync::CancellationToken;

fn completed(job: &str) -> ExportCompleted {
    ExportCompleted {
        job_id: job.to_owned(),
        caller: "alice".into(),
        format: "json".into(),
        query: format!("evolution {job}"),
        result_id: format!("exports/{job}/1.json"),
        size_bytes: 77,
        sha256: "cd".repeat(32),
        completed_at_ms: 1_764_403_200_000,
        version: 2,
        content_type: "application/json".into(),
    }
}

fn as_v1(c: &ExportCompleted) -> ExportCompletedV1 {
    ExportCompletedV1 {
        job_id: c.job_id.clone(),
        caller: c.caller.clone(),
        format: c.format.clone(),
        query: c.query.clone(),
        result_id: c.result_id.clone(),
        size_bytes: c.size_bytes,
        sha256: c.sha256.clone(),
        completed_at_ms: c.completed_at_ms,
        version: c.version,
    }
}

/// Reads `n` records of `topic` from the beginning, decoded as a consumer
/// of this build does.
async fn read(brokers: &str, topic: &str, n: usize) -> anyhow::Result<Vec<DecodedEvent>> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", herald_testkit::unique("evolution-reader"))
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .create()?;
    consumer.subscribe(&[topic])?;
    let mut out = Vec::new();
    while out.len() < n {
        let msg = tokio::time::timeout(Duration::from_secs(60), consumer.recv()).await??;
        out.push(decode_record(&msg)?);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread")]
async fn v1_reader_reads_v2_data_and_v2_reader_reads_v1_data_on_the_real_broker() -> anyhow::Result<()> {
    let brokers = herald_testkit::real_broker()?;
    let topics = Topics::with_prefix(&herald_testkit::unique("evo"));
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &[topics.events.as_str()], herald_kafka::TopicSettings::partitions(1)).await?;
    let (old, new) = (completed("job-old"), completed("job-new"));
    // An old producer writes v1, a new one v2, onto the same topic.
    let events = vec![
        OutboxEvent::new(&topics.events, "job-old", &as_v1(&old), Utc::now())?,
        OutboxEvent::new(&topics.events, "job-new", &new, Utc::now())?,
    ];
    workload::publish(&workload::producer(&KafkaConfig::new(&brokers))?, &events).await?;

    let got = read(&brokers, &topics.events, 2).await?;
    let (v1_data, v2_data) = (&got[0], &got[1]);
    assert_eq!(v1_data.schema_file, "export.completed.v1.avsc");
    assert_eq!(v2_data.schema_file, "export.completed.v2.avsc");
    assert_eq!(v1_data.key, events[0].key());

    // A consumer built for v1 reads both: v2's new field is skipped.
    assert_eq!(v1_data.data_as::<ExportCompletedV1>()?, as_v1(&old));
    assert_eq!(v2_data.data_as::<ExportCompletedV1>()?, as_v1(&new));
    // A consumer built for v2 reads both: v1 data gets the field's default.
    assert_eq!(v1_data.data_as::<ExportCompleted>()?, ExportCompleted { content_type: DEFAULT_CONTENT_TYPE.into(), ..old });
    assert_eq!(v2_data.data_as::<ExportCompleted>()?, new);
    Ok(())
}

/// A schema released after this build: v2 plus `row_count`.
const V3_FILE: &str = "export.completed.v3.avsc";

fn v3_text() -> String {
    let v2 = herald_envelope::schema::FILES.iter().find(|(f, _)| *f == ExportCompleted::SCHEMA_FILE).expect("v2").1;
    let mut json: serde_json::Value = serde_json::from_str(v2).expect("v2 json");
    json["fields"].as_array_mut().expect("fields").push(serde_json::json!({"name": "row_count", "type": "long", "default": 0}));
    json.to_string()
}

/// `data` written by a producer that already has v3.
fn v3_event(topic: &str, data: &ExportCompleted) -> anyhow::Result<OutboxEvent> {
    let schema = Schema::parse_str(&v3_text())?;
    let Avro::Record(mut fields) = to_value(data)? else { anyhow::bail!("not a record") };
    fields.push(("row_count".into(), Avro::Long(10)));
    let mut event = OutboxEvent::new(topic, &data.job_id, data, Utc::now())?;
    event.schema_file = V3_FILE.to_owned();
    event.data = GenericDatumWriter::builder(&schema).build()?.write_value_to_vec(Avro::Record(fields))?;
    event.partition_key = "one-partition".into();
    Ok(event)
}

async fn eventually<F, Fut>(what: &str, mut probe: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + Duration::from_secs(90);
    while !probe().await? {
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_schema_is_dead_lettered_and_applied_after_deploy_and_redrive() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let brokers = herald_testkit::real_broker()?;
    let topics = Topics::with_prefix(&herald_testkit::unique("evo"));
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &[topics.events.as_str()], herald_kafka::TopicSettings::partitions(2)).await?;
    // The unknown-schema record first, then a known one in the same
    // partition: the subscription must move past the first to apply the second.
    let future = completed("job-future");
    let mut known = OutboxEvent::new(&topics.events, "job-known", &completed("job-known"), Utc::now())?;
    known.partition_key = "one-partition".into();
    let unknown = v3_event(&topics.events, &future)?;
    workload::publish(&workload::producer(&KafkaConfig::new(&brokers))?, &[unknown.clone(), known]).await?;

    // The consumer is built with this build's schemas only.
    let sub = Name::Search.subscription(&herald_testkit::unique("herald"), &KafkaConfig::new(&brokers), &topics.events);
    let (stop, metrics, options) = (CancellationToken::new(), Metrics::default(), SubscriptionOptions::default());
    let run = subscriptions::run(Name::Search, &db, &sub, &options, &metrics, stop.clone());
    let wait = async {
        eventually("one applied, one dead letter", || async {
            Ok(inbox::count(&db, "search").await? == 1 && dead_letter::count(&db, "search", dead_letter::DEAD).await? == 1)
        })
        .await?;
        stop.cancel();
        anyhow::Ok(())
    };
    let (snapshot, waited) = tokio::join!(run, wait);
    waited?;
    let s = snapshot?;
    assert_eq!((s.applied, s.dead_lettered), (1, 1), "{s:?}");

    let letters = dead_letter::list(&db, Some("search"), Some(dead_letter::DEAD)).await?;
    let letter = &letters[0];
    assert_eq!(letter.error, format!("unknown schema {V3_FILE}"));
    assert_eq!(letter.attempts, 1, "an unknown schema is not retried: the same bytes give the same answer");

    // Redriven before the schema is deployed: still unknown, still dead.
    let before = herald_consumer::redrive(&db, &Live::new(Search, &topics.events), letter).await?;
    assert_eq!(before, Redriven::Failed(format!("unknown schema {V3_FILE}")));
    let letter = dead_letter::get(&db, letter.id).await?.expect("kept");
    assert_eq!(letter.status, dead_letter::DEAD);
    assert_eq!(search::count_active(&db).await?, 1);

    // Deployed as `--schemas DIR` deploys it: a directory read beside the
    // compiled-in schemas, checked for compatibility with them. The
    // registry now has v3; the v2 reader resolves v3 data.
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join(V3_FILE), v3_text())?;
    let deployed = Registry::embedded().with_dir(dir.path())?;
    assert_eq!(herald_consumer::redrive_with(&db, &Live::new(Search, &topics.events), &deployed, &letter).await?, Redriven::Applied);
    assert_eq!(search::count_active(&db).await?, 2);
    let hits = search::search(&db, "alice", "evolution job-future", 10).await?.hits;
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!((hits[0].job_id.as_str(), hits[0].size_bytes), ("job-future", 77));
    assert_eq!(inbox::count(&db, "search").await?, 2);
    let letter = dead_letter::get(&db, letter.id).await?.expect("kept as redriven");
    assert_eq!(letter.status, dead_letter::REDRIVEN);
    assert_eq!(herald_consumer::redrive_with(&db, &Live::new(Search, &topics.events), &deployed, &letter).await?, Redriven::NotDead);
    db.close().await;
    Ok(())
}
