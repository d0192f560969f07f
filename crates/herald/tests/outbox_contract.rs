//! The public outbox contract, used from outside Rust: a Python program
//! (psycopg, tests/contract/append_events.py) appends events with
//! `herald.append_event(...)` inside its own transactions; `herald relay`,
//! routing by event type (`--route`), publishes them on the shared Apache
//! Kafka cluster as CloudEvents carrying the caller's attributes. A
//! rolled-back transaction publishes nothing; a duplicate (source, id) and
//! data that is not what its content type says are refused with a clear
//! error. The SQL slice function agrees with the relay's Rust rule on the
//! test vectors of docs/outbox-contract.md.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use herald_envelope::{EventData, ExportCompleted};
use herald_kafka::{KafkaConfig, TopicSettings};
use herald_store::Db;
use herald_store::outbox::slice_of;
use herald_testkit::kafka::{Record, read_all};
use herald_testkit::{docs, unique, wait_until};
use sqlx::Row;

const PARTITIONS: i32 = 2;

const CONTRACT: &str = "docs/outbox-contract.md";

/// `(key, slice)` rows of the vector table in docs/outbox-contract.md.
fn documented_vectors() -> anyhow::Result<Vec<(String, i32)>> {
    let vectors: Vec<(String, i32)> = docs::read(CONTRACT)?
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.trim().strip_prefix("| `")?.split('|').map(str::trim).collect();
            let key = cells.first()?.strip_suffix('`')?;
            Some((key.to_owned(), cells.get(1)?.parse().ok()?))
        })
        .collect();
    anyhow::ensure!(vectors.len() >= 8, "docs/outbox-contract.md lists {} slice vectors", vectors.len());
    Ok(vectors)
}

#[test]
fn documented_slice_vectors_match_the_relays_rule() -> anyhow::Result<()> {
    for (key, slice) in documented_vectors()? {
        assert_eq!(slice_of(&key), slice, "slice of {key:?}");
    }
    Ok(())
}

struct Relay(Child);

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn python(url: &str, run: &str) -> anyhow::Result<serde_json::Value> {
    let out = Command::new("python3").arg(docs::path("tests/contract/append_events.py")).args([url, run]).output()?;
    anyhow::ensure!(out.status.success(), "append_events.py failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn ids(report: &serde_json::Value, field: &str) -> Vec<String> {
    report[field].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_owned)).collect()
}

/// `record` as a consumer receives it.
fn as_message(record: &Record) -> rdkafka::message::OwnedMessage {
    let mut headers = rdkafka::message::OwnedHeaders::new();
    for (key, value) in &record.headers {
        headers = headers.insert(rdkafka::message::Header { key, value: Some(value.as_bytes()) });
    }
    rdkafka::message::OwnedMessage::new(
        Some(record.value.clone()),
        Some(record.key.clone().into_bytes()),
        "t".into(),
        rdkafka::Timestamp::NotAvailable,
        record.partition,
        record.offset,
        Some(headers),
    )
}

fn header<'r>(record: &'r Record, name: &str) -> Option<&'r str> {
    record.headers.get(name).map(String::as_str)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_service_appends_in_its_own_transaction_and_the_relay_routes_by_type_postgres() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let brokers = herald_testkit::real_broker()?;
    let prefix = unique("contract");
    let (orders, other) = (format!("{prefix}.orders"), format!("{prefix}.other"));
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &[orders.as_str(), other.as_str()], TopicSettings::partitions(PARTITIONS))
        .await?;

    // The SQL rule is the Rust rule.
    for (key, slice) in documented_vectors()? {
        let row = sqlx::query("SELECT herald.slice_of($1) AS s").bind(&key).fetch_one(db.pool()).await?;
        assert_eq!(row.try_get::<i32, _>("s")?, slice, "herald.slice_of({key:?})");
    }

    // The document's own example, as printed, in a transaction rolled back
    // after a look at what it wrote.
    let example = docs::block(CONTRACT, "sql", "SELECT herald.append_event(")?;
    let mut tx = db.begin().await?;
    sqlx::raw_sql(&example).execute(&mut *tx).await?;
    let row = sqlx::query("SELECT slice, content_type, extensions, topic FROM outbox WHERE event_id = 'order-1001-placed'")
        .fetch_one(&mut *tx)
        .await?;
    assert_eq!(row.try_get::<i32, _>("slice")?, slice_of("order-1001"));
    assert_eq!(row.try_get::<String, _>("content_type")?, "application/json");
    assert_eq!(row.try_get::<String, _>("extensions")?, r#"{"tenant": "acme"}"#);
    assert_eq!(row.try_get::<String, _>("topic")?, "", "routed by the relay");
    tx.rollback().await?;

    // What the function refuses, each with SQLSTATE 22023 and the reason,
    // writing nothing.
    let valid = "id => 'x', type => 't', subject => '', partition_key => 'k', data => '\\x7b7d'";
    for (call, reason) in [
        ("source => ''", "are required"),
        ("source => '/s', content_type => 'application/avro'", "needs a dataschema"),
        ("source => '/s', content_type => 'text/plain'", "content_type must be"),
        ("source => '/s', extensions => '{\"Tenant\":\"a\"}'", "extension name"),
        ("source => '/s', extensions => '{\"id\":\"a\"}'", "extension name"),
        ("source => '/s', extensions => '{\"n\":1}'", "must be a string"),
        ("source => '/s', traceparent => 'nope'", "traceparent"),
    ] {
        let sql = format!("SELECT 1 AS appended FROM herald.append_event({valid}, {call})");
        let Err(refused) = sqlx::query(&sql).fetch_one(db.pool()).await else { panic!("accepted: {call}") };
        let database = refused.as_database_error().expect("a database error");
        assert_eq!(database.code().as_deref(), Some("22023"), "{call}: {refused}");
        assert!(database.message().contains(reason), "{call}: {refused}");
    }
    let written = sqlx::query("SELECT COUNT(*) AS n FROM outbox").fetch_one(db.pool()).await?;
    assert_eq!(written.try_get::<i64, _>("n")?, 0, "a refused append writes nothing");

    let run = unique("py");
    let report = python(&test_db.url, &run)?;
    let committed = ids(&report, "committed");
    assert_eq!(committed.len(), 7, "{report}");
    let duplicate = report["duplicate_error"].as_str().unwrap_or_default();
    assert!(duplicate.contains("is already in the outbox") && duplicate.contains(&format!("{run}-placed-0")), "{report}");
    let bad = report["bad_data_error"].as_str().unwrap_or_default();
    assert!(bad.contains("data is not JSON"), "{report}");

    // Avro through the contract: Herald's own schema, named by file.
    let archived = ExportCompleted {
        job_id: format!("{run}-job"),
        caller: "shop".into(),
        format: "csv".into(),
        query: "orders of the day".into(),
        result_id: "r".into(),
        size_bytes: 1,
        sha256: "00".repeat(32),
        completed_at_ms: 1,
        version: 1,
        content_type: "text/csv".into(),
    };
    sqlx::query(
        "SELECT 1 AS appended FROM herald.append_event(source => '/shop/orders', id => $1, type => 'shop.order.archived', \
         subject => $2, partition_key => $2, data => $3, content_type => 'application/avro', dataschema => $4)",
    )
    .bind(format!("{run}-archived"))
    .bind(format!("{run}-order-0"))
    .bind(archived.to_avro()?)
    .bind(ExportCompleted::SCHEMA_FILE)
    .fetch_one(db.pool())
    .await?;

    let _relay = Relay(
        Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(["relay", "--database", &test_db.url, "--kafka", &brokers, "--owner", "contract"])
            .args(["--route", &format!("shop.order.*={orders}"), "--default-topic", &other])
            .args(["--dataschema-base", "https://herald.example/schemas"])
            .env("HERALD_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?,
    );
    let delivered = || async {
        let row = sqlx::query("SELECT COUNT(*) AS n FROM outbox WHERE source = '/shop/orders'").fetch_one(db.pool()).await?;
        let total: i64 = row.try_get("n")?;
        Ok(total == 8 && herald_store::outbox::count_by_status(&db, herald_store::outbox::DELIVERED).await? == 8)
    };
    wait_until("the relay to deliver the 8 committed events", Duration::from_secs(90), delivered).await?;

    let on_orders = read_all(&brokers, &orders, PARTITIONS)?;
    let on_other = read_all(&brokers, &other, PARTITIONS)?;
    let (avro, on_orders): (Vec<Record>, Vec<Record>) =
        on_orders.into_iter().partition(|r| header(r, "ce_type") == Some("shop.order.archived"));
    assert_eq!(on_orders.len(), 6, "{on_orders:?}");
    let [avro] = &avro[..] else { panic!("one Avro event: {avro:?}") };
    assert_eq!(header(avro, "content-type"), Some("application/avro"));
    assert_eq!(header(avro, "ce_dataschema"), Some(format!("https://herald.example/schemas/{}", ExportCompleted::SCHEMA_FILE).as_str()));
    let registry = herald_envelope::Registry::embedded().accepting(herald_envelope::Sources::new(["/shop/orders".to_owned()])?);
    let decoded = herald_envelope::decode_any_with(&as_message(avro), &registry)?;
    assert_eq!(decoded.data_as::<ExportCompleted>()?, archived, "a consumer resolves the URL's file and reads the data");
    assert_eq!(on_other.iter().map(|r| r.ce_id.as_str()).collect::<Vec<_>>(), [format!("{run}-signup")]);
    let published: Vec<&str> = on_orders.iter().chain(&on_other).map(|r| r.ce_id.as_str()).collect();
    assert!(!published.contains(&report["rolled_back"].as_str().unwrap_or("?")), "a rolled-back event was published");

    for record in &on_orders {
        let order = record.key.clone();
        assert!(order.starts_with(&format!("{run}-order-")), "key is the caller's partition key: {record:?}");
        assert_eq!(header(record, "ce_source"), Some("/shop/orders"));
        assert_eq!(header(record, "ce_subject"), Some(order.as_str()));
        assert_eq!(header(record, "content-type"), Some("application/json"));
        assert_eq!(header(record, "ce_dataschema"), None);
        let data: serde_json::Value = serde_json::from_slice(&record.value)?;
        assert_eq!(data["order_id"], order.as_str());
        match header(record, "ce_type") {
            Some("shop.order.placed") => assert_eq!(header(record, "ce_tenant"), Some("acme"), "{record:?}"),
            Some("shop.order.paid") => assert_eq!(header(record, "ce_tenant"), None),
            other => panic!("unexpected type {other:?}"),
        }
    }
    // Per key, commit order: placed before paid.
    for n in 0..3 {
        let of_key: Vec<&str> =
            on_orders.iter().filter(|r| r.key == format!("{run}-order-{n}")).map(|r| header(r, "ce_type").unwrap_or_default()).collect();
        assert_eq!(of_key, ["shop.order.placed", "shop.order.paid"]);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_service_appends_with_the_documented_sqlite_insert_sqlite() -> anyhow::Result<()> {
    let test_db = herald_testkit::sqlite_db()?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let brokers = herald_testkit::real_broker()?;
    let topic = unique("contract-sqlite");
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &[topic.as_str()], TopicSettings::partitions(PARTITIONS)).await?;

    // The application: Python's sqlite3, the INSERT as the document prints
    // it, the slice by the document's rule.
    let run = unique("sq");
    let file = test_db.url.trim_start_matches("sqlite://").trim_end_matches("?mode=rwc").to_owned();
    let mut child = Command::new("python3")
        .arg(docs::path("tests/contract/append_events_sqlite.py"))
        .args([&file, &run])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    std::io::Write::write_all(&mut child.stdin.take().expect("piped"), docs::block(CONTRACT, "sql", "INSERT INTO outbox")?.as_bytes())?;
    let out = child.wait_with_output()?;
    anyhow::ensure!(out.status.success(), "append_events_sqlite.py failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(ids(&report, "committed").len(), 2, "{report}");
    assert!(report["duplicate_error"].as_str().unwrap_or_default().contains("UNIQUE"), "{report}");
    // The slice Python computed is the relay's.
    for row in sqlx::query("SELECT partition_key, slice FROM outbox").fetch_all(db.pool()).await? {
        assert_eq!(row.try_get::<i32, _>("slice")?, slice_of(&row.try_get::<String, _>("partition_key")?));
    }

    let _relay = Relay(
        Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(["relay", "--database", &test_db.url, "--kafka", &brokers, "--owner", "contract", "--default-topic", &topic])
            .env("HERALD_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?,
    );
    let delivered = || async { Ok(herald_store::outbox::count_by_status(&db, herald_store::outbox::DELIVERED).await? == 2) };
    wait_until("the relay to deliver both events", Duration::from_secs(90), delivered).await?;
    let records = read_all(&brokers, &topic, PARTITIONS)?;
    let types: Vec<&str> = records.iter().map(|r| header(r, "ce_type").unwrap_or_default()).collect();
    assert_eq!(types, ["shop.order.placed", "shop.order.paid"], "in commit order, the rolled-back one absent: {records:?}");
    let key = format!("{run}-order-1");
    for record in &records {
        assert_eq!((record.key.as_str(), header(record, "ce_subject")), (key.as_str(), Some(key.as_str())));
        assert_eq!(header(record, "ce_source"), Some("/shop/orders"));
        assert_eq!(header(record, "ce_tenant"), Some("acme"));
        assert_eq!(header(record, "content-type"), Some("application/json"));
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&record.value)?["order_id"], key.as_str());
    }
    Ok(())
}
