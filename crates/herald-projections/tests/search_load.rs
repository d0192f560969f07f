//! A replay loads a search generation on PostgreSQL into a table of its own
//! and seals it (`Projection::prepare_load`, `load_pg`, `seal_load`): the
//! loaded rows become the generation's partition with the parent's indexes,
//! live traffic's rows of the generation written meanwhile are merged under
//! the version guard, nothing older replaces anything newer, and sealing
//! twice changes nothing. A generation whose values the table from before
//! migration 0024 holds gets its loaded rows merged there instead. Live
//! writes name the partition the seal returned, and one that went through
//! `search_documents` while the seal attached lands in the new partition.
//! The seal builds its btrees without parallel workers. The loading table
//! has no key: a job loaded twice is settled at the seal as the version
//! guard would have, and the key built then. A seal resumed after its
//! attach leaves live writes to the partition alone.

mod common;

use common::completed;
use herald_consumer::{Arrived, HandlerError, Projection, WritePath};
use herald_projections::search::{self, Fact, Search};
use herald_store::Db;
use herald_testkit::{TestDb, postgres_db};
use sqlx::{Connection, Row};

/// A migrated database with generation 9 ready to load (its own table).
async fn loading_9() -> anyhow::Result<(TestDb, Db)> {
    let test_db = postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    Search.prepare_load(&db, 9).await?;
    Ok((test_db, db))
}

/// The replay's write: through the native driver into the loading table,
/// each fact with the offset it arrived at, along `path`, committed when it
/// succeeds; the projection's own error otherwise, for the test to look at.
async fn try_load_at(db: &Db, generation: i64, facts: &[(i64, Fact)], path: WritePath) -> anyhow::Result<Result<(), HandlerError>> {
    let arrived: Vec<Arrived<'_, Fact>> = facts.iter().map(|(offset, fact)| Arrived { offset: *offset, fact }).collect();
    let mut conn = sqlx::PgConnection::connect(db.url()).await?;
    let mut tx = conn.begin().await?;
    if let Err(e) = Search.load_pg(&mut tx, generation, &arrived, path).await {
        return Ok(Err(e));
    }
    tx.commit().await?;
    Ok(Ok(()))
}

/// [`try_load_at`] with the facts at offsets 0, 1, 2, …
async fn try_load(db: &Db, generation: i64, facts: &[Fact], path: WritePath) -> anyhow::Result<Result<(), HandlerError>> {
    let at: Vec<(i64, Fact)> = facts.iter().cloned().enumerate().map(|(i, f)| (i as i64, f)).collect();
    try_load_at(db, generation, &at, path).await
}

/// The replay's plain write, which must succeed.
async fn load(db: &Db, generation: i64, facts: &[Fact]) -> anyhow::Result<()> {
    Ok(try_load(db, generation, facts, WritePath::Plain).await??)
}

/// Live traffic's write: the shared path into `search_documents`.
async fn live(db: &Db, generation: i64, facts: &[Fact]) -> anyhow::Result<()> {
    let refs: Vec<&Fact> = facts.iter().collect();
    let mut tx = db.begin().await?;
    Search.write(&mut tx, generation, &refs).await?;
    tx.commit().await?;
    Ok(())
}

/// Live traffic's write on the native driver, as the engine makes it:
/// `storage` as the engine read it from `projection_generations`.
async fn live_pg(db: &Db, generation: i64, storage: Option<&str>, facts: &[Fact]) -> anyhow::Result<()> {
    let refs: Vec<&Fact> = facts.iter().collect();
    let mut conn = sqlx::PgConnection::connect(db.url()).await?;
    let mut tx = conn.begin().await?;
    Search.write_pg(&mut tx, generation, storage, &refs, WritePath::Upsert).await?;
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
    let (_test_db, db) = loading_9().await?;
    load(&db, 9, &[completed("a", 2), completed("b", 1), completed("c", 3)]).await?;
    // Live traffic writes the generation meanwhile: an older a, a newer b, e only it has.
    live(&db, 9, &[completed("a", 1), completed("b", 5), completed("e", 1)]).await?;
    assert_eq!(versions(&db, 9).await?, pairs(&[("a", 1), ("b", 5), ("e", 1)]), "before the seal reads see live traffic's rows only");

    assert_eq!(Search.seal_load(&db, 9).await?.as_deref(), Some("search_documents_g9"));
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

    // After the seal live traffic writes the partition, through the parent
    // or naming it; a name that is not the generation's is not used.
    // Sealing again changes nothing.
    live(&db, 9, &[completed("c", 4)]).await?;
    live_pg(&db, 9, Some("search_documents_g9"), &[completed("f", 1)]).await?;
    live_pg(&db, 9, Some("search_documents_default"), &[completed("g", 1)]).await?;
    assert_eq!(Search.seal_load(&db, 9).await?.as_deref(), Some("search_documents_g9"));
    let expected = pairs(&[("a", 2), ("b", 5), ("c", 4), ("e", 1), ("f", 1), ("g", 1)]);
    assert_eq!(versions(&db, 9).await?, expected);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM search_documents_g9").await?, 6, "every row in the generation's partition");

    sqlx::query("UPDATE active_generations SET generation = 9 WHERE projection = 'search'").execute(db.pool()).await?;
    let hits: Vec<String> = search::search(&db, "alice", "c v4", 10).await?.hits.into_iter().map(|h| h.job_id).collect();
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
    assert_eq!(Search.seal_load(&db, 1).await?, None, "the generation's rows stay in the old table");
    assert_eq!(versions(&db, 1).await?, pairs(&[("a", 3), ("b", 2), ("c", 1)]));
    let storage = "SELECT COUNT(*) FROM projection_generations WHERE projection = 'search' AND generation = 1 \
                   AND storage = 'search_documents_legacy'";
    assert_eq!(count(&db, storage).await?, 1, "migration 0024 named the old table for the generation it holds");
    assert_eq!(count(&db, "SELECT COUNT(*) FROM search_documents_legacy WHERE generation = 1").await?, 3);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM pg_class WHERE relname = 'search_documents_g1'").await?, 0, "the loading table is gone");
    live_pg(&db, 1, Some("search_documents_legacy"), &[completed("d", 1)]).await?;
    assert_eq!(count(&db, "SELECT COUNT(*) FROM search_documents_legacy WHERE job_id = 'd'").await?, 1);
    Search.seal_load(&db, 1).await?;
    assert_eq!(versions(&db, 1).await?, pairs(&[("a", 3), ("b", 2), ("c", 1), ("d", 1)]), "sealing again changes nothing");
    Ok(())
}

/// Locks of this database's sessions that wait.
async fn waiting(db: &Db) -> anyhow::Result<i64> {
    count(
        db,
        "SELECT COUNT(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database WHERE d.datname = current_database() AND NOT l.granted",
    )
    .await
}

/// Polls until `n` locks of this database wait: the gate's only clock.
async fn until_waiting(db: &Db, n: i64) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while waiting(db).await? < n {
        anyhow::ensure!(std::time::Instant::now() < deadline, "{n} waiting locks never came");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    Ok(())
}

/// A live write that read no storage (the seal had not committed) and went
/// through `search_documents` while the seal attached: held by a gate on the
/// loaded table, the seal is at its attach with the default partition
/// merged, and the write is started then. It must land in the new
/// partition: routed to the default partition instead, it would fail its
/// constraint once the attach committed (a dead letter in the engine).
#[tokio::test]
async fn a_write_through_the_parent_during_the_attach_lands_in_the_new_partition_postgres() -> anyhow::Result<()> {
    let (_test_db, db) = loading_9().await?;
    load(&db, 9, &[completed("a", 1)]).await?;
    live(&db, 9, &[completed("b", 1)]).await?;

    let mut gate = sqlx::PgConnection::connect(db.url()).await?;
    let mut held = gate.begin().await?;
    sqlx::query("LOCK TABLE search_documents_g9 IN ACCESS SHARE MODE").execute(&mut *held).await?;
    let seal = tokio::spawn({
        let db = db.clone();
        async move { Search.seal_load(&db, 9).await }
    });
    until_waiting(&db, 1).await?;
    let write = tokio::spawn({
        let db = db.clone();
        async move { live_pg(&db, 9, None, &[completed("c", 1)]).await }
    });
    until_waiting(&db, 2).await?;
    held.rollback().await?;

    assert_eq!(seal.await??.as_deref(), Some("search_documents_g9"));
    write.await??;
    assert_eq!(versions(&db, 9).await?, pairs(&[("a", 1), ("b", 1), ("c", 1)]));
    assert_eq!(count(&db, "SELECT COUNT(*) FROM search_documents_g9").await?, 3, "all three in the generation's partition");
    Ok(())
}

/// A rebuild that resumes after its seal attached the generation (stopped
/// before it recorded the storage, verified or switched) seals again while
/// live traffic writes the partition. That second seal must not lock the
/// partition: the loading table's `CREATE INDEX IF NOT EXISTS`, run on the
/// attached table, takes a lock against writes even when the index is
/// there, and would wait for a live write and hold the next ones. Gate: a
/// live write into the partition held open; the seal must end while it is
/// open, and no lock of the database may wait meanwhile.
#[tokio::test]
async fn a_seal_resumed_after_its_attach_leaves_live_writes_alone_postgres() -> anyhow::Result<()> {
    let (_test_db, db) = loading_9().await?;
    load(&db, 9, &[completed("a", 1)]).await?;
    assert_eq!(Search.seal_load(&db, 9).await?.as_deref(), Some("search_documents_g9"));

    let mut writer = sqlx::PgConnection::connect(db.url()).await?;
    let mut open = writer.begin().await?;
    let b = completed("b", 1);
    Search.write_pg(&mut open, 9, Some("search_documents_g9"), &[&b], WritePath::Upsert).await?;
    let seal = Search.seal_load(&db, 9);
    tokio::select! {
        sealed = seal => assert_eq!(sealed?.as_deref(), Some("search_documents_g9")),
        waited = until_waiting(&db, 1) => {
            waited?;
            anyhow::bail!("the resumed seal waited for a lock the live write holds");
        }
    }
    open.commit().await?;
    assert_eq!(versions(&db, 9).await?, pairs(&[("a", 1), ("b", 1)]));
    Ok(())
}

/// The replay loads in one `COPY`: whatever bytes a value holds arrive as
/// they are, a deletion's tombstone keeps its NULLs and times, and a job
/// the table already holds is appended again (the table has no key to
/// conflict on until the seal, which keeps the newer).
#[tokio::test]
async fn the_load_copies_values_as_they_are_and_a_job_loaded_twice_is_appended_postgres() -> anyhow::Result<()> {
    let (_test_db, db) = loading_9().await?;
    let odd = "tab\there, line\nbreak\r, back\\slash, \\N, \\. and ü";
    let Fact::Completed(mut export) = completed("a", 2) else { unreachable!() };
    export.query = odd.to_owned();
    export.caller = "\\N".to_owned();
    load(&db, 9, &[Fact::Completed(export), deleted("d", 4)]).await?;
    let row = sqlx::query("SELECT caller, query FROM search_documents_g9 WHERE job_id = 'a'").fetch_one(db.pool()).await?;
    assert_eq!((row.try_get::<String, _>("caller")?, row.try_get::<String, _>("query")?), ("\\N".to_owned(), odd.to_owned()));
    let tombstone = sqlx::query("SELECT deleted_at_ms, version FROM search_documents_g9 WHERE job_id = 'd'").fetch_one(db.pool()).await?;
    assert_eq!((tombstone.try_get::<Option<i64>, _>(0)?, tombstone.try_get::<i64, _>(1)?), (Some(77), 4));
    let untouched = "SELECT COUNT(*) FROM search_documents_g9 WHERE deleted_at_ms IS NULL AND job_id = 'a'";
    assert_eq!(count(&db, untouched).await?, 1, "a document's deleted_at_ms is NULL, not a value");

    load(&db, 9, &[completed("a", 3), completed("b", 1)]).await?;
    assert_eq!(count(&db, "SELECT COUNT(*) FROM search_documents_g9 WHERE job_id = 'a'").await?, 2);
    Search.seal_load(&db, 9).await?;
    assert_eq!(versions(&db, 9).await?, pairs(&[("a", 3), ("b", 1), ("d", 4)]));
    Ok(())
}

/// A job loaded more than once is settled at the seal as the version guard
/// settles it: the newest version stays, whatever order it came in, and of
/// equal versions the one that arrived first (the smallest offset), though
/// a later batch brought it. A seal that stopped after building the
/// indexes seals again; the sealed partition has its primary key and no
/// `arrival` column.
#[tokio::test]
async fn the_seal_keeps_of_each_job_what_the_version_guard_would_postgres() -> anyhow::Result<()> {
    let (_test_db, db) = loading_9().await?;
    let b = |query: &str| {
        let Fact::Completed(mut export) = completed("b", 3) else { unreachable!() };
        export.query = query.to_owned();
        Fact::Completed(export)
    };
    try_load_at(&db, 9, &[(5, completed("a", 2)), (6, b("six")), (7, deleted("c", 4)), (8, completed("e", 1))], WritePath::Plain).await??;
    try_load_at(&db, 9, &[(9, completed("a", 1)), (10, b("ten")), (11, completed("c", 5)), (12, deleted("e", 2))], WritePath::Plain)
        .await??;
    // Another partition's records, met in a later batch, one of them at an
    // offset smaller than the other b's.
    try_load_at(&db, 9, &[(2, b("two")), (3, completed("c", 3)), (4, completed("a", 2))], WritePath::Plain).await??;
    search::build_indexes(&db, "search_documents_g9").await?;
    assert_eq!(count(&db, "SELECT COUNT(*) FROM search_documents_g9").await?, 4, "the rows the guard would not have kept went");

    assert_eq!(Search.seal_load(&db, 9).await?.as_deref(), Some("search_documents_g9"));
    assert_eq!(versions(&db, 9).await?, pairs(&[("a", 2), ("b", 3), ("c", 5), ("e", 2)]));
    let query: String =
        sqlx::query_scalar("SELECT query FROM search_documents WHERE generation = 9 AND job_id = 'b'").fetch_one(db.pool()).await?;
    assert_eq!(query, "two", "of equal versions, the first to arrive");
    let a_arrival = "SELECT COUNT(*) FROM search_documents WHERE generation = 9 AND job_id = 'a' AND query = 'a v2'";
    assert_eq!(count(&db, a_arrival).await?, 1);
    let key = "SELECT COUNT(*) FROM pg_constraint WHERE conrelid = 'search_documents_g9'::regclass AND contype = 'p'";
    assert_eq!(count(&db, key).await?, 1, "the partition has its primary key");
    let arrival = "SELECT COUNT(*) FROM pg_attribute WHERE attrelid = 'search_documents_g9'::regclass \
                   AND attname = 'arrival' AND NOT attisdropped";
    assert_eq!(count(&db, arrival).await?, 0, "nor does it keep the loading table's arrival");
    live_pg(&db, 9, Some("search_documents_g9"), &[completed("c", 4), completed("f", 1)]).await?;
    assert_eq!(versions(&db, 9).await?, pairs(&[("a", 2), ("b", 3), ("c", 5), ("e", 2), ("f", 1)]), "the key is the guard's");
    Ok(())
}

/// A replay an earlier Herald began has a loading table with its primary
/// key and no `arrival`: preparing it again adds the column and keeps the
/// key, a job loaded again conflicts and is written under the version
/// guard, and the seal keeps the key it has.
#[tokio::test]
async fn a_loading_table_of_an_earlier_herald_is_loaded_on_and_sealed_postgres() -> anyhow::Result<()> {
    let test_db = postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    sqlx::raw_sql(
        "CREATE TABLE search_documents_g9 (LIKE search_documents, PRIMARY KEY (generation, job_id), \
         CONSTRAINT search_documents_g9_generation CHECK (generation = 9)) WITH (autovacuum_enabled = false);
         INSERT INTO search_documents_g9 VALUES (9, 'a', 'alice', 'csv', 'a v2', 'r', 1, 2, 2, NULL)",
    )
    .execute(db.pool())
    .await?;
    Search.prepare_load(&db, 9).await?;
    let again = [completed("a", 3), completed("b", 1)];
    let plain = try_load(&db, 9, &again, WritePath::Plain).await?;
    assert!(matches!(plain, Err(HandlerError::Conflict(_))), "{plain:?}");
    try_load(&db, 9, &again, WritePath::Upsert).await??;
    assert_eq!(Search.seal_load(&db, 9).await?.as_deref(), Some("search_documents_g9"));
    assert_eq!(versions(&db, 9).await?, pairs(&[("a", 3), ("b", 1)]));
    assert_eq!(count(&db, "SELECT COUNT(*) FROM pg_index WHERE indrelid = 'search_documents_g9'::regclass").await?, 4);
    Ok(())
}

fn deleted(job: &str, version: i64) -> Fact {
    Fact::Deleted(herald_envelope::ExportDeleted { job_id: job.into(), caller: "alice".into(), deleted_at_ms: 77, version })
}

/// The seal builds the btrees and the key without parallel workers and
/// leaves the GIN's session as it is (BENCHMARKS.md, "The btrees give the
/// GIN its core"): an event trigger notes the setting each `CREATE INDEX`
/// of the seal ran under, the database's default being 2. The tombstones'
/// index is the loading table's from the start: the seal has none to build.
#[tokio::test]
async fn the_seal_builds_its_btrees_without_parallel_workers_postgres() -> anyhow::Result<()> {
    let test_db = postgres_db().await?;
    let mut setup = sqlx::PgConnection::connect(&test_db.url).await?;
    let name: String = sqlx::query_scalar("SELECT current_database()").fetch_one(&mut setup).await?;
    sqlx::query(&format!("ALTER DATABASE \"{name}\" SET max_parallel_maintenance_workers = 2")).execute(&mut setup).await?;
    sqlx::raw_sql(
        "CREATE TABLE index_builds (index_name TEXT, workers TEXT);
         CREATE FUNCTION note_index_build() RETURNS event_trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO index_builds SELECT object_identity, current_setting('max_parallel_maintenance_workers')
                 FROM pg_event_trigger_ddl_commands() WHERE command_tag = 'CREATE INDEX';
         END $$;
         CREATE EVENT TRIGGER note_index_build ON ddl_command_end WHEN TAG IN ('CREATE INDEX')
             EXECUTE FUNCTION note_index_build();",
    )
    .execute(&mut setup)
    .await?;
    setup.close().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    Search.prepare_load(&db, 9).await?;
    load(&db, 9, &[completed("a", 1)]).await?;
    sqlx::query("DELETE FROM index_builds").execute(db.pool()).await?;

    assert_eq!(Search.seal_load(&db, 9).await?.as_deref(), Some("search_documents_g9"));
    let builds: Vec<(String, String)> =
        sqlx::query_as("SELECT index_name, workers FROM index_builds ORDER BY index_name").fetch_all(db.pool()).await?;
    let expected = [
        ("public.search_documents_g9_by_caller", "0"),
        ("public.search_documents_g9_pkey", "0"),
        ("public.search_documents_g9_query_trgm", "2"),
    ];
    let builds: Vec<(&str, &str)> = builds.iter().map(|(i, w)| (i.as_str(), w.as_str())).collect();
    assert_eq!(builds, expected, "the btrees without workers, the GIN's session untouched, the tombstones' index built before");
    Ok(())
}
