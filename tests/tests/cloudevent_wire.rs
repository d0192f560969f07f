//! What a non-Herald consumer sees on the real broker: a plain rdkafka
//! consumer reads a completion record and checks the CloudEvents binary-mode
//! headers and the Avro value against the schema file `dataschema` names.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use apache_avro::Schema;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value as Avro;
use common::{ALICE, Broker, Database, export_body};
use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};

#[tokio::test(flavor = "multi_thread")]
async fn completion_record_is_a_binary_mode_cloudevent_with_avro_data() -> anyhow::Result<()> {
    let stack = common::start(Database::Sqlite, Broker::Real).await?;
    let (status, _, answer) = stack.post_export(ALICE, Some("wire-1"), &export_body("csv", "wire check")).await?;
    assert_eq!(status, 202);
    let job_id = answer["job_id"].as_str().expect("job_id").to_owned();
    stack.wait_for_hits(ALICE, "wire", 1).await?;

    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", stack.wiring.kafka.brokers())
        .set("group.id", herald_testkit::unique("plain-reader"))
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .create()?;
    consumer.subscribe(&[&stack.wiring.topics.events])?;
    let msg = tokio::time::timeout(Duration::from_secs(60), consumer.recv()).await??;

    let headers: HashMap<String, String> = msg
        .headers()
        .expect("headers")
        .iter()
        .map(|h| (h.key.to_owned(), String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned()))
        .collect();
    assert_eq!(headers["ce_specversion"], "1.0");
    assert_eq!(headers["ce_type"], "herald.export.completed");
    assert_eq!(headers["ce_source"], "/herald/exports");
    assert_eq!(headers["ce_subject"], job_id);
    assert!(!headers["ce_id"].is_empty());
    assert!(headers["ce_time"].contains('T'), "{}", headers["ce_time"]);
    assert_eq!(headers["content-type"], "application/avro");
    assert_eq!(msg.key(), Some(job_id.as_bytes()), "record key is the partition key (the subject)");

    let file = headers["ce_dataschema"].strip_prefix("herald:schemas/").expect("dataschema names a file under schemas/");
    let text = std::fs::read_to_string(format!("{}/../schemas/{file}", env!("CARGO_MANIFEST_DIR")))?;
    let schema = Schema::parse_str(&text)?;
    let mut payload = msg.payload().expect("payload");
    let datum = GenericDatumReader::builder(&schema).build()?.read_value(&mut payload)?;
    assert!(payload.is_empty(), "exactly one datum");
    let Avro::Record(fields) = datum else { panic!("not a record: {datum:?}") };
    let field = |name: &str| fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    assert_eq!(field("job_id"), Some(Avro::String(job_id.clone())));
    assert_eq!(field("caller"), Some(Avro::String("alice".into())));
    assert_eq!(field("format"), Some(Avro::String("csv".into())));
    stack.stop().await
}
