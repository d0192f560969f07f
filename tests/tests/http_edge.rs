//! Bad input at the HTTP edge: problem+json with the right status, and
//! nothing written. Intake idempotency: same key and body → same job; same
//! key, other body → 409.

mod common;

use common::{ALICE, Database, export_body};
use herald_api::AppState;
use herald_export::IntakeConfig;
use herald_export::artifact::ArtifactStore;
use herald_kafka::Topics;
use herald_store::Db;
use tokio_util::sync::CancellationToken;

async fn api_only(database: Database) -> anyhow::Result<()> {
    let test_db = common::test_db(database).await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let shutdown = CancellationToken::new();
    let artifacts_dir = tempfile::tempdir()?;
    let state = AppState {
        db: db.clone(),
        intake: IntakeConfig { quota: 2, ..IntakeConfig::new(Topics::default()) },
        artifacts: ArtifactStore::local(artifacts_dir.path())?,
        tokens: common::tokens(),
        searches: herald_api::limits::SearchSlots::default(),
    };
    let server = tokio::spawn(herald_api::serve(listener, state, shutdown.clone()));
    let http = reqwest::Client::new();
    let good = export_body("csv", "edge");

    let cases: [(&str, &str, Option<&str>, &str, u16); 6] = [
        ("missing key", ALICE, None, &good, 400),
        ("unknown token", "nope", Some("k1"), &good, 401),
        ("malformed json", ALICE, Some("k2"), "{\"format\":", 422),
        ("unknown format", ALICE, Some("k3"), r#"{"format":"xml","query":"q"}"#, 422),
        ("empty query", ALICE, Some("k4"), r#"{"format":"csv","query":""}"#, 422),
        ("unknown field", ALICE, Some("k5"), r#"{"format":"csv","query":"q","x":1}"#, 422),
    ];
    for (name, token, key, body, want) in cases {
        let (status, headers, problem) = common::post_export(&http, &base, token, key, body).await?;
        assert_eq!(status, want, "{name}: {problem}");
        assert_eq!(headers["content-type"], "application/problem+json", "{name}");
        assert_eq!(problem["status"], want, "{name}");
        assert!(problem["detail"].as_str().is_some_and(|d| !d.is_empty()), "{name}: {problem}");
    }
    for table in ["export_jobs", "export_intents", "outbox"] {
        assert_eq!(common::count(&db, &format!("SELECT COUNT(*) AS n FROM {table}")).await?, 0, "{table} after bad input");
    }

    let (status, _, first) = common::post_export(&http, &base, ALICE, Some("same"), &good).await?;
    assert_eq!(status, 202);
    let (status, _, second) = common::post_export(&http, &base, ALICE, Some("same"), &good).await?;
    assert_eq!((status, &second["job_id"]), (202, &first["job_id"]));
    let (status, _, conflict) = common::post_export(&http, &base, ALICE, Some("same"), &export_body("json", "edge")).await?;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(common::count(&db, "SELECT COUNT(*) AS n FROM export_jobs").await?, 1);
    assert_eq!(common::count(&db, "SELECT COUNT(*) AS n FROM outbox").await?, 1);

    // No result before the job finished; someone else cannot even tell it exists.
    let job_id = first["job_id"].as_str().expect("job_id");
    let status_of = |token: &'static str| {
        let url = format!("{base}/v1/exports/{job_id}/result");
        let http = http.clone();
        async move { anyhow::Ok(http.get(url).bearer_auth(token).send().await?.status().as_u16()) }
    };
    assert_eq!(status_of(ALICE).await?, 409);
    assert_eq!(status_of(common::BOB).await?, 404);

    // Quota of unfinished jobs: the second fits, the third is refused with a hint.
    let (status, _, _) = common::post_export(&http, &base, ALICE, Some("second"), &export_body("csv", "two")).await?;
    assert_eq!(status, 202);
    let (status, headers, problem) = common::post_export(&http, &base, ALICE, Some("third"), &export_body("csv", "three")).await?;
    assert_eq!(status, 429, "{problem}");
    assert_eq!(headers["retry-after"], "5");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert_eq!(common::count(&db, "SELECT COUNT(*) AS n FROM export_jobs").await?, 2);
    // A repeat of an accepted request is not a new job, so quota does not refuse it.
    let (status, _, _) = common::post_export(&http, &base, ALICE, Some("second"), &export_body("csv", "two")).await?;
    assert_eq!(status, 202);

    // A search text longer than any real query is refused before it runs.
    let long = "x".repeat(herald_api::routes::MAX_SEARCH_CHARS + 1);
    let answer = http.get(format!("{base}/v1/search")).query(&[("q", &long)]).bearer_auth(ALICE).send().await?;
    assert_eq!(answer.status().as_u16(), 400);
    assert_eq!(answer.headers()["content-type"], "application/problem+json");
    let fits = "x".repeat(herald_api::routes::MAX_SEARCH_CHARS);
    assert_eq!(http.get(format!("{base}/v1/search")).query(&[("q", &fits)]).bearer_auth(ALICE).send().await?.status().as_u16(), 200);

    // What a failed attempt or a failing database says stays in the log.
    sqlx::query("UPDATE export_jobs SET last_error = 'connect to db.internal:5432: refused', failures = 1 WHERE job_id = $1")
        .bind(job_id)
        .execute(db.pool())
        .await?;
    let job: serde_json::Value = http.get(format!("{base}/v1/exports/{job_id}")).bearer_auth(ALICE).send().await?.json().await?;
    assert_eq!(job["last_error"], herald_export::jobs::ATTEMPT_FAILED, "{job}");
    sqlx::query("ALTER TABLE export_jobs RENAME TO export_jobs_away").execute(db.pool()).await?;
    let answer = http.get(format!("{base}/v1/exports/{job_id}")).bearer_auth(ALICE).send().await?;
    let status = answer.status().as_u16();
    let problem: serde_json::Value = answer.json().await?;
    sqlx::query("ALTER TABLE export_jobs_away RENAME TO export_jobs").execute(db.pool()).await?;
    assert_eq!(status, 503, "{problem}");
    let text = problem.to_string();
    assert!(!text.contains("export_jobs") && !text.contains("relation") && !text.contains("table"), "internal text leaked: {problem}");
    assert!(problem["instance"].as_str().is_some_and(|i| i.starts_with("urn:herald:problem:")), "an id the log repeats: {problem}");

    shutdown.cancel();
    server.await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn http_edge_sqlite() -> anyhow::Result<()> {
    api_only(Database::Sqlite).await
}

#[tokio::test(flavor = "multi_thread")]
async fn http_edge_postgres() -> anyhow::Result<()> {
    api_only(Database::Postgres).await
}
