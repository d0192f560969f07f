//! Search is served by an index, and the index never changes an answer:
//! case-insensitive substrings, `%`, `_` and quotes taken literally, texts
//! too short for trigrams, documents rewritten and deleted — on PostgreSQL
//! (trigram GIN index on `lower(query)`) and SQLite (FTS5 trigram table kept
//! by triggers).

use herald_consumer::Projection;
use herald_envelope::{ExportCompleted, ExportDeleted};
use herald_projections::search::{self, Fact, Search, search_statement};
use herald_store::{Backend, Db};
use herald_testkit::{postgres_db, sqlite_db};
use sqlx::Row;

fn completed(job: &str, caller: &str, query: &str, version: i64) -> Fact {
    Fact::Completed(ExportCompleted {
        job_id: job.into(),
        caller: caller.into(),
        format: "csv".into(),
        query: query.into(),
        result_id: format!("r-{job}"),
        size_bytes: 1,
        sha256: String::new(),
        completed_at_ms: version,
        version,
        content_type: "text/csv".into(),
    })
}

async fn write(db: &Db, facts: &[Fact]) -> anyhow::Result<()> {
    let generation: i64 = sqlx::query("SELECT generation FROM active_generations WHERE projection = 'search'")
        .fetch_one(db.pool())
        .await?
        .try_get("generation")?;
    let refs: Vec<&Fact> = facts.iter().collect();
    let mut tx = db.begin().await?;
    Search.write(&mut tx, generation, &refs).await?;
    tx.commit().await?;
    Ok(())
}

async fn found(db: &Db, caller: &str, text: &str) -> anyhow::Result<Vec<String>> {
    let mut jobs: Vec<String> = search::search(db, caller, text, 100).await?.hits.into_iter().map(|h| h.job_id).collect();
    jobs.sort();
    Ok(jobs)
}

async fn answers_stay_exact(db: &Db) -> anyhow::Result<()> {
    write(
        db,
        &[
            completed("j1", "alice", "Invoices 2026 Q1", 1),
            completed("j2", "alice", "invoice_%special", 1),
            completed("j3", "alice", "a \"quoted\" word", 1),
            completed("j4", "alice", "ab", 1),
            completed("j5", "bob", "invoices of bob", 1),
        ],
    )
    .await?;
    assert_eq!(found(db, "alice", "invoices").await?, ["j1"]);
    assert_eq!(found(db, "alice", "VOICE").await?, ["j1", "j2"], "case-insensitive");
    assert_eq!(found(db, "alice", "_%s").await?, ["j2"], "% and _ are literal");
    assert_eq!(found(db, "alice", "e_%").await?, ["j2"]);
    assert_eq!(found(db, "alice", "\"quoted\"").await?, ["j3"], "quotes are literal");
    assert_eq!(found(db, "alice", "ab").await?, ["j4"], "two characters, below trigrams");
    assert_eq!(found(db, "bob", "invoices").await?, ["j5"], "scoped by caller");
    assert!(found(db, "alice", "zzz").await?.is_empty());

    // A newer version rewrites the query; a delete leaves a tombstone.
    write(db, &[completed("j1", "alice", "Receipts 2027", 2)]).await?;
    assert!(found(db, "alice", "invoices").await?.is_empty(), "the old text is gone from the index");
    assert_eq!(found(db, "alice", "receipts").await?, ["j1"]);
    let deleted = ExportDeleted { job_id: "j1".into(), caller: "alice".into(), deleted_at_ms: 3, version: 3 };
    write(db, &[Fact::Deleted(deleted)]).await?;
    assert!(found(db, "alice", "receipts").await?.is_empty(), "deleted");
    Ok(())
}

#[tokio::test]
async fn postgres_answers_through_the_trigram_index() -> anyhow::Result<()> {
    let test_db = postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    answers_stay_exact(&db).await?;
    // Without a sequential scan to fall back on, a substring LIKE must be
    // answerable from an index: only the trigram index can.
    let mut tx = db.begin().await?;
    sqlx::query("SET LOCAL enable_seqscan = off").execute(&mut *tx).await?;
    let plan: Vec<String> = sqlx::query("EXPLAIN SELECT job_id FROM search_documents WHERE lower(query) LIKE '%voic%'")
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| r.try_get::<String, _>(0))
        .collect::<Result<_, _>>()?;
    // Each partition's own trigram index (search_documents_legacy_query_trgm, …).
    assert!(plan.iter().any(|line| line.contains("Index Scan on search_documents_") && line.contains("_query_trgm")), "{plan:#?}");
    assert!(!plan.iter().any(|line| line.contains("Seq Scan")), "{plan:#?}");
    Ok(())
}

/// The insert that finds the trigram index's pending list full merges all
/// of it before returning: at the server's 4 MB default one search
/// transaction a second stalled 100-370 ms at 10,000 events/s (migration
/// 0023). The limit is the index's own, so every writer and server gets it.
#[tokio::test]
async fn postgres_trigram_index_merges_its_pending_list_in_small_steps() -> anyhow::Result<()> {
    let test_db = postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let options: Option<String> =
        sqlx::query("SELECT array_to_string(reloptions, ',') FROM pg_class WHERE relname = 'search_documents_query_trgm'")
            .fetch_one(db.pool())
            .await?
            .try_get(0)?;
    assert_eq!(options.as_deref(), Some("gin_pending_list_limit=512"));
    Ok(())
}

#[tokio::test]
async fn sqlite_answers_through_the_fts5_index() -> anyhow::Result<()> {
    let test_db = sqlite_db()?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    answers_stay_exact(&db).await?;
    let plan = |statement: &str| {
        let statement = format!("EXPLAIN QUERY PLAN {statement}");
        let db = db.clone();
        async move {
            let rows = sqlx::query(&statement)
                .bind(1_i64)
                .bind("alice")
                .bind("%voic%")
                .bind(100_i64)
                .bind("\"voic\"")
                .fetch_all(db.pool())
                .await?;
            rows.iter().map(|r| r.try_get::<String, _>("detail")).collect::<Result<Vec<_>, _>>().map_err(anyhow::Error::from)
        }
    };
    let indexed = plan(search_statement(Backend::Sqlite, true)).await?;
    assert!(indexed.iter().any(|d| d.contains("search_fts")), "{indexed:#?}");
    assert!(indexed.iter().any(|d| d.contains("search_documents_by_caller") || d.contains("INTEGER PRIMARY KEY")), "{indexed:#?}");
    let short = plan(search_statement(Backend::Sqlite, false)).await?;
    assert!(short.iter().any(|d| d.contains("search_documents_by_caller")), "{short:#?}");
    Ok(())
}
