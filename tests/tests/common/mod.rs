//! A Herald stack for one test: its own database, its own topics and groups,
//! its own artifacts directory, real HTTP on loopback.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use herald::pipeline::{self, Running, Wiring};
use herald_api::Tokens;
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_store::Db;
use herald_testkit::TestDb;
use serde_json::{Value, json};
use sqlx::Row;

pub const ALICE: &str = "alice-token";
pub const BOB: &str = "bob-token";

pub enum Database {
    Postgres,
    Sqlite,
}

pub enum Broker {
    /// librdkafka's in-process mock cluster.
    Mock,
    /// The real Kafka-protocol broker process started by `scripts/test`.
    Real,
}

pub struct Stack {
    pub running: Option<Running>,
    pub db: Db,
    pub wiring: Wiring,
    pub base: String,
    pub http: reqwest::Client,
    _test_db: TestDb,
    _kafka: Option<EmbeddedKafka>,
    _artifacts: tempfile::TempDir,
}

pub async fn test_db(database: Database) -> anyhow::Result<TestDb> {
    match database {
        Database::Postgres => herald_testkit::postgres_db().await,
        Database::Sqlite => herald_testkit::sqlite_db(),
    }
}

pub fn tokens() -> Tokens {
    Tokens::parse(&format!("{ALICE}:alice,{BOB}:bob")).expect("tokens")
}

/// Starts every role of the thin path on fresh topics and groups.
pub async fn start(database: Database, broker: Broker) -> anyhow::Result<Stack> {
    let test_db = test_db(database).await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let topics = Topics::with_prefix(&herald_testkit::unique("t"));
    let (brokers, kafka) = match broker {
        Broker::Mock => {
            let kafka = EmbeddedKafka::start(1, &topics.all(), 4)?;
            (kafka.bootstrap_servers().to_owned(), Some(kafka))
        }
        Broker::Real => {
            let brokers = herald_testkit::real_broker()?;
            herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), herald_kafka::TopicSettings::partitions(4)).await?;
            (brokers, None)
        }
    };
    let artifacts = tempfile::tempdir()?;
    let wiring = Wiring {
        db: db.clone(),
        kafka: KafkaConfig::new(brokers),
        topics,
        group_prefix: herald_testkit::unique("herald"),
        artifacts: artifacts.path().display().to_string(),
        tokens: tokens(),
    };
    let running = pipeline::start(wiring.clone(), "127.0.0.1:0").await?;
    let base = format!("http://{}", running.api_addr.expect("api role"));
    Ok(Stack {
        running: Some(running),
        db,
        wiring,
        base,
        http: reqwest::Client::new(),
        _test_db: test_db,
        _kafka: kafka,
        _artifacts: artifacts,
    })
}

impl Stack {
    pub async fn post_export(
        &self,
        token: &str,
        key: Option<&str>,
        body: &str,
    ) -> anyhow::Result<(u16, reqwest::header::HeaderMap, Value)> {
        post_export(&self.http, &self.base, token, key, body).await
    }

    pub async fn get(&self, token: &str, path_and_query: &str) -> anyhow::Result<(u16, Value)> {
        let response = self.http.get(format!("{}{path_and_query}", self.base)).bearer_auth(token).send().await?;
        let status = response.status().as_u16();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    /// Waits for a condition on the search API; the pipeline is asynchronous,
    /// so the test watches for the outcome with a generous deadline.
    pub async fn wait_for_hits(&self, token: &str, q: &str, want: usize) -> anyhow::Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let (status, answer) = self.get(token, &format!("/v1/search?q={q}")).await?;
            anyhow::ensure!(status == 200, "search answered {status}: {answer}");
            if answer["hits"].as_array().map_or(0, Vec::len) >= want {
                return Ok(answer);
            }
            anyhow::ensure!(Instant::now() < deadline, "search never reached {want} hits: {answer}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn count(&self, sql: &str) -> anyhow::Result<i64> {
        count(&self.db, sql).await
    }

    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(running) = self.running.take() {
            running.stop().await?;
        }
        Ok(())
    }
}

pub async fn post_export(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    key: Option<&str>,
    body: &str,
) -> anyhow::Result<(u16, reqwest::header::HeaderMap, Value)> {
    let mut request =
        http.post(format!("{base}/v1/exports")).bearer_auth(token).header("content-type", "application/json").body(body.to_owned());
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    Ok((status, headers, response.json().await.unwrap_or(Value::Null)))
}

pub async fn count(db: &Db, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query(sql).fetch_one(db.pool()).await?.try_get::<i64, _>("n")?)
}

pub fn export_body(format: &str, query: &str) -> String {
    json!({"format": format, "query": query}).to_string()
}
