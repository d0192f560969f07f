//! A replay loads a search generation on PostgreSQL into a table of its own
//! and seals it (`Projection::prepare_load`, `load_pg`, `seal_load`): the
//! loaded rows become the generation's partition with the parent's indexes,
//! live traffic's rows of the generation written meanwhile are merged under
//! the version guard, nothing older replaces anything newer, and sealing
//! twice changes nothing. A generation whose values the table from before
//! migration 0024 holds gets its loaded rows merged there instead.

use herald_consumer::{Projection, WritePath};
use herald_envelope::ExportCompleted;
use herald_projections::search::{self, Fact, Search};
use herald_store::Db;
use herald_testkit::postgres_db;
use sqlx::{Connection, Row};

fn completed(job: &str, version: i64) -> Fact {
    Fact::Completed(ExportCompleted {
        job_id: job.into(),
        caller: "alice".into(),
        format: "csv".into(),
        query: format!("loaded {job} v{version}"),
        result_id: "r".into(),
        size_bytes: 1,
        sha256: String::new(),
        completed_at_ms: version,
        version,
        content_type: "text/csv".into(),
    })
}

/// The replay's write: through the native driver into the loading table.
async fn load(db: &Db, generation: i64, facts: &[Fact]) -> anyhow::Result<()> {
    let refs: Vec<&Fact> = facts.iter().collect();
    let mut conn = sqlx::PgConnection::connect(db.url()).await?;
    let mut tx = conn.begin().await?;
    Search.load_pg(&mut tx, generation, &refs, WritePath::Plain).await?;
    tx.commit().await?;
    Ok(())
}

/// Live traffic's write: the shared path into `search_documents`.
async fn live(db: &Db, generation: i64, facts: &[Fact]) -> anyhow::Result<()> {
    let refs: Vec<&Fact> = facts.iter().collect();
    let mut tx = db.begin().await?;
    Search.write(&mut tx, generation, &refs).await?;
    tx.commit().await?;
    Ok(())
}

/// What reads find in `generation`, through `search_documents`.
async fn versions(db: &Db, generation: i64) -> anyhow::Result<Vec<(String, i64)>> {
    let rows = sqlx::query("SELECT job_id, version FROM search_documents WHERE generation = $1 ORDER BY job_id")
        .bind(generation)
        .fetch_all(db.pool())
        .await?;
    Ok(rows.iter().map(|r| Ok((r.try_get("job_id")?, r.try_get("version")?))).collect::<Result<_, sqlx::Error>>()?)
}

async fn count(db: &Db, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query(sql).fetch_one(db.pool()).await?.try_get(0)?)
}

fn pairs(expected: &[(&str, i64)]) -> Vec<(String, i64)> {
    expected.iter().map(|(j, v)| ((*j).to_owned(), *v)).collect()
}

#[tokio::test]
async fn a_loaded_generation_becomes_its_partition_with_live_writes_merged_postgres() -> anyhow::Result<()> {
    let test_db = postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    Search.prepare_load(&db, 9).await?;
    load(&db, 9, &[completed("a", 2), completed("b", 1), completed("c", 3)]).await?;
    // Live traffic writes the generation meanwhile: an older a, a newer b, e only it has.
    live(&db, 9, &[completed("a", 1), completed("b", 5), completed("e", 1)]).await?;
    assert_eq!(versions(&db, 9).await?, pairs(&[("a", 1), ("b", 5), ("e", 1)]), "before the seal reads see live traffic's rows only");

    Search.seal_load(&db, 9).await?;
    let sealed = pairs(&[("a", 2), ("b", 5), ("c", 3), ("e", 1)]);
    assert_eq!(versions(&db, 9).await?, sealed, "the newer version of each job, wherever it was written");
    assert_eq!(count(&db, "SELECT COUNT(*) FROM search_documents_default WHERE generation = 9").await?, 0);
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM pg_inherits WHERE inhparent = 'search_documents'::regclass AND inhrelid = 'search_documents_g9'::regclass"
        )
        .await?,
        1,
        "the loaded table is the generation's partition"
    );
    // The parent's four indexes, each the partition's own, taken as built:
    // an index of the seal that did not match the parent's would stay beside
    // one the attach built, and the table would have more than four.
    let attached = "SELECT COUNT(*) FROM pg_index i JOIN pg_inherits h ON h.inhrelid = i.indexrelid \
                    WHERE i.indrelid = 'search_documents_g9'::regclass AND i.indisvalid";
    assert_eq!(count(&db, attached).await?, 4);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM pg_index WHERE indrelid = 'search_documents_g9'::regclass").await?, 4);
    let options = "SELECT COUNT(*) FROM pg_class WHERE oid = 'search_documents_g9'::regclass AND reloptions IS NULL";
    assert_eq!(count(&db, options).await?, 1, "autovacuum, off while it loaded, is back as for any partition");

    // After the seal live traffic writes the partition; sealing again changes nothing.
    live(&db, 9, &[completed("c", 4)]).await?;
    Search.seal_load(&db, 9).await?;
    assert_eq!(versions(&db, 9).await?, pairs(&[("a", 2), ("b", 5), ("c", 4), ("e", 1)]));

    sqlx::query("UPDATE active_generations SET generation = 9 WHERE projection = 'search'").execute(db.pool()).await?;
    let hits: Vec<String> = search::search(&db, "alice", "loaded c v4", 10).await?.hits.into_iter().map(|h| h.job_id).collect();
    assert_eq!(hits, ["c"], "the trigram index answers from the sealed partition");
    Ok(())
}

#[tokio::test]
async fn a_generation_the_old_table_holds_gets_its_loaded_rows_merged_there_postgres() -> anyhow::Result<()> {
    let test_db = postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    // Generation 1 was there before migration 0024: its values are the old table's.
    live(&db, 1, &[completed("a", 3), completed("b", 1)]).await?;
    Search.prepare_load(&db, 1).await?;
    load(&db, 1, &[completed("a", 2), completed("b", 2), completed("c", 1)]).await?;
    Search.seal_load(&db, 1).await?;
    assert_eq!(versions(&db, 1).await?, pairs(&[("a", 3), ("b", 2), ("c", 1)]));
    assert_eq!(count(&db, "SELECT COUNT(*) FROM search_documents_legacy WHERE generation = 1").await?, 3);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM pg_class WHERE relname = 'search_documents_g1'").await?, 0, "the loading table is gone");
    Search.seal_load(&db, 1).await?;
    assert_eq!(versions(&db, 1).await?, pairs(&[("a", 3), ("b", 2), ("c", 1)]), "sealing again changes nothing");
    Ok(())
}
