//! The walking skeleton end to end: HTTP intake → outbox → relay → Kafka →
//! worker → completion in the outbox → relay → search subscription → search
//! API, on PostgreSQL and SQLite, on the mock cluster and the real broker.

mod common;

use common::{ALICE, BOB, Broker, Database, export_body};

async fn thin_path(database: Database, broker: Broker) -> anyhow::Result<()> {
    let stack = common::start(database, broker).await?;
    let mut job_ids = Vec::new();
    for i in 0..3 {
        let body = export_body(if i == 0 { "json" } else { "csv" }, &format!("thin path {i}"));
        let (status, headers, answer) = stack.post_export(ALICE, Some(&format!("key-{i}")), &body).await?;
        assert_eq!(status, 202, "{answer}");
        assert_eq!(answer["status"], "pending");
        let job_id = answer["job_id"].as_str().expect("job_id").to_owned();
        assert_eq!(headers["location"].to_str()?, format!("/v1/exports/{job_id}"));
        job_ids.push(job_id);
    }
    // The same request again is the same job, not a new one.
    let (_, _, again) = stack.post_export(ALICE, Some("key-1"), &export_body("csv", "thin path 1")).await?;
    assert_eq!(again["job_id"].as_str(), Some(job_ids[1].as_str()));

    let found = stack.wait_for_hits(ALICE, "thin%20path", 3).await?;
    assert_eq!(found["generation"], 1);
    let mut hit_ids: Vec<String> =
        found["hits"].as_array().expect("hits").iter().map(|h| h["job_id"].as_str().expect("job_id").to_owned()).collect();
    hit_ids.sort();
    let mut want = job_ids.clone();
    want.sort();
    assert_eq!(hit_ids, want);

    let (status, job) = stack.get(ALICE, &format!("/v1/exports/{}", job_ids[0])).await?;
    assert_eq!(status, 200);
    assert_eq!(job["status"], "succeeded");
    assert!(job["result_sha256"].as_str().is_some_and(|s| s.len() == 64), "{job}");
    // The owner downloads the selected result; its checksum is the job's.
    let result = stack.http.get(format!("{}/v1/exports/{}/result", stack.base, job_ids[0])).bearer_auth(ALICE).send().await?;
    assert_eq!(result.status(), 200);
    assert_eq!(result.headers()["content-type"], "application/json");
    let bytes = result.bytes().await?;
    assert_eq!(job["result_size"].as_u64(), Some(bytes.len() as u64));
    assert_eq!(job["result_sha256"].as_str(), Some(sha256_hex(&bytes).as_str()));
    // Another caller cannot see it, fetch it, nor find it.
    assert_eq!(stack.get(BOB, &format!("/v1/exports/{}", job_ids[0])).await?.0, 404);
    assert_eq!(stack.get(BOB, &format!("/v1/exports/{}/result", job_ids[0])).await?.0, 404);
    assert_eq!(stack.get(BOB, "/v1/search?q=thin").await?.1["hits"].as_array().map(Vec::len), Some(0));

    assert_eq!(stack.count("SELECT COUNT(*) AS n FROM export_jobs").await?, 3);
    assert_eq!(stack.count("SELECT COUNT(*) AS n FROM outbox WHERE event_type = 'herald.export.completed'").await?, 3);
    assert_eq!(stack.count("SELECT COUNT(*) AS n FROM inbox WHERE subscription = 'search'").await?, 3);
    stack.stop().await
}

#[tokio::test(flavor = "multi_thread")]
async fn thin_path_sqlite_mock_cluster() -> anyhow::Result<()> {
    thin_path(Database::Sqlite, Broker::Mock).await
}

#[tokio::test(flavor = "multi_thread")]
async fn thin_path_postgres_mock_cluster() -> anyhow::Result<()> {
    thin_path(Database::Postgres, Broker::Mock).await
}

#[tokio::test(flavor = "multi_thread")]
async fn thin_path_sqlite_real_broker() -> anyhow::Result<()> {
    thin_path(Database::Sqlite, Broker::Real).await
}

#[tokio::test(flavor = "multi_thread")]
async fn thin_path_postgres_real_broker() -> anyhow::Result<()> {
    thin_path(Database::Postgres, Broker::Real).await
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}
