//! Notifications from any event, by configuration: a rules file makes an
//! application's JSON event (`shop.order.shipped`, through the contract's
//! wire form) create an intent for the recipient and with the body its
//! templates name, on PostgreSQL and the shared Apache Kafka cluster; a
//! file replaces the built-in export rule, so a completion on the same
//! topic creates nothing; a bad rules file stops `herald consume notify`
//! with exit 2 naming the rule. (The built-in rule's intents are the ones
//! every notify test checks, e.g. notify_dispatch.)

use std::time::Duration;

use herald::bench::workload;
use herald_consumer::{Metrics, Subscription, SubscriptionOptions};
use herald_envelope::{JSON_CONTENT_TYPE, OutboxEvent, Registry, Sources};
use herald_kafka::{KafkaConfig, Topics};
use herald_notify::intents::NotifyHandler;
use herald_notify::templates::NotifyRules;
use herald_store::Db;
use herald_testkit::{unique, wait_until};
use sqlx::Row;
use tokio_util::sync::CancellationToken;

const RULES: &str = r#"
[[notify]]
type = "shop.order.shipped"
kind = "order.shipped"
recipient = "{data.customer}"
reference = "{data.order_id}"
[notify.body]
order_id = "{data.order_id}"
items = "{data.items}"
text = "Your order {data.order_id} is on its way ({ext.carrier})"
"#;

fn shipped(topic: &str, run: &str) -> OutboxEvent {
    let order = format!("{run}-o-7");
    let mut event = OutboxEvent::new(topic, &order, &workload::completion(run, 0), chrono::Utc::now()).expect("an event");
    event.source = "/shop/orders".into();
    event.event_type = "shop.order.shipped".into();
    event.schema_file = String::new();
    event.content_type = JSON_CONTENT_TYPE.into();
    event.data = format!(r#"{{"order_id":"{order}","customer":"bob","items":3}}"#).into_bytes();
    event.extensions.insert("carrier".into(), "post".into());
    event
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rules_file_turns_an_applications_event_into_an_intent_postgres() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let brokers = herald_testkit::real_broker()?;
    let topics = Topics::with_prefix(&unique("rules"));
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), herald_kafka::TopicSettings::partitions(1)).await?;
    let run = unique("run");
    let mut events = vec![shipped(&topics.events, &run)];
    events.extend(workload::completions(&topics.events, &run, 1)?);
    workload::publish(&workload::producer(&KafkaConfig::new(&brokers))?, &events).await?;

    let sub = Subscription::new("notify", &unique("herald"), &KafkaConfig::new(&brokers), &[topics.events.as_str()]);
    let sources = Sources::new(["/shop/*".to_owned(), "/herald/exports".to_owned()])?;
    let options = SubscriptionOptions { registry: Registry::embedded().accepting(sources), ..SubscriptionOptions::default() };
    let handler = NotifyHandler::new(NotifyRules::parse(RULES)?);
    let metrics = Metrics::default();
    let stop = CancellationToken::new();
    let running = herald_consumer::run_subscription(&sub, &db, &handler, &options, &metrics, stop.clone());
    let checked = async {
        wait_until("both records seen", Duration::from_secs(90), || async {
            let s = metrics.snapshot();
            Ok(s.applied + s.skipped >= 2)
        })
        .await?;
        stop.cancel();
        anyhow::Ok(())
    };
    let (ran, checked) = tokio::join!(running, checked);
    checked?;
    let snapshot = ran?;
    assert_eq!((snapshot.applied, snapshot.skipped, snapshot.dead_lettered), (1, 1, 0), "{snapshot:?}");

    let rows = sqlx::query("SELECT recipient, kind, job_id, body, source FROM notification_intents").fetch_all(db.pool()).await?;
    assert_eq!(rows.len(), 1, "the completion creates nothing under a file without its rule");
    let row = &rows[0];
    assert_eq!(row.try_get::<String, _>("recipient")?, "bob");
    assert_eq!(row.try_get::<String, _>("kind")?, "order.shipped");
    assert_eq!(row.try_get::<String, _>("job_id")?, format!("{run}-o-7"));
    assert_eq!(row.try_get::<String, _>("source")?, "/shop/orders");
    let body: serde_json::Value = serde_json::from_str(&row.try_get::<String, _>("body")?)?;
    let expected =
        serde_json::json!({"order_id": format!("{run}-o-7"), "items": 3, "text": format!("Your order {run}-o-7 is on its way (post)")});
    assert_eq!(body, expected);
    Ok(())
}

#[test]
fn a_bad_rules_file_stops_consume_with_exit_2_naming_the_rule() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("rules.toml");
    std::fs::write(&path, "[[notify]]\ntype = \"a\"\nkind = \"k\"\nrecipient = \"{payload.to}\"\n")?;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["consume", "notify", "--notify-rules"])
        .arg(&path)
        .env_remove("HERALD_DATABASE_URL")
        .env_remove("HERALD_KAFKA_BROKERS")
        .env("HERALD_LOG", "warn")
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--notify-rules") && stderr.contains("rule 1") && stderr.contains("payload.to"), "{stderr}");
    Ok(())
}
