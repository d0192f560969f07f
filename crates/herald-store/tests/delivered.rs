//! "Delivered" derived from the relay's cursor (issue 20), on both
//! databases: a row the cursor of its slice passed reads as delivered in
//! every reader (`count_by_status`, `outbox list`, a rebuild's settled
//! filter); a row it has not passed — including one whose transaction was
//! still open when the step's snapshot was taken, whatever its sequence —
//! reads as pending; a set-aside row keeps its own status; a row an older
//! release marked `delivered` stays delivered.

use chrono::Utc;
use herald_envelope::OutboxEvent;
use herald_store::delivered::{self, Cursor, Settled};
use herald_store::outbox::{self, DELIVERED, FAILED, PENDING};
use herald_store::{Backend, Db, Tx};
use herald_testkit::TestDb;
use sqlx::Row;

async fn setup(postgres: bool) -> anyhow::Result<(TestDb, Db)> {
    let test_db = if postgres { herald_testkit::postgres_db().await? } else { herald_testkit::sqlite_db()? };
    let db = Db::connect_and_migrate(&test_db.url).await?;
    Ok((test_db, db))
}

/// Every row of the test is one key's, so one slice's.
const KEY: &str = "order-7";

fn event(id: &str) -> OutboxEvent {
    OutboxEvent {
        id: id.to_owned(),
        source: "/test".into(),
        event_type: "test.happened".into(),
        subject: id.to_owned(),
        time: Utc::now(),
        schema_file: "none".into(),
        data: vec![1, 2, 3],
        content_type: herald_envelope::AVRO_CONTENT_TYPE.to_owned(),
        extensions: Default::default(),
        topic: "test".into(),
        partition_key: KEY.into(),
        trace: None,
    }
}

async fn append(tx: &mut Tx<'_>, id: &str) -> anyhow::Result<i64> {
    Ok(outbox::append(tx, &event(id)).await?)
}

async fn commit_one(db: &Db, id: &str) -> anyhow::Result<i64> {
    let mut tx = db.begin().await?;
    let seq = append(&mut tx, id).await?;
    tx.commit().await?;
    Ok(seq)
}

async fn set_cursor(db: &Db, cursor: &Cursor) -> anyhow::Result<()> {
    sqlx::query("UPDATE relay_slices SET cursor_lo = $1, cursor_hi = $2, cursor_xid = $3, cursor_seq = $4 WHERE slice = $5")
        .bind(&cursor.lo)
        .bind(cursor.hi.as_deref())
        .bind(cursor.xid)
        .bind(cursor.seq)
        .bind(outbox::slice_of(KEY))
        .execute(db.pool())
        .await?;
    Ok(())
}

/// Derived status of every row, by event id, as `outbox list` gives it.
async fn statuses(db: &Db) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for status in outbox::STATUSES {
        for row in outbox::list(db, status, 100).await? {
            out.push((row.event_id, row.status));
        }
    }
    out.sort();
    Ok(out)
}

fn expect(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = pairs.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect();
    v.sort();
    v
}

/// Event ids the settled filter of `settled` selects.
async fn settled_ids(db: &Db, settled: &Settled) -> anyhow::Result<Vec<String>> {
    let sql = format!("SELECT event_id FROM outbox WHERE {} ORDER BY event_id", settled.outbox_filter(db.backend()));
    Ok(sqlx::query(&sql).fetch_all(db.pool()).await?.iter().map(|r| r.try_get("event_id")).collect::<Result<_, _>>()?)
}

async fn xid_of(db: &Db, seq: i64) -> anyhow::Result<i64> {
    let row =
        sqlx::query("SELECT CAST(CAST(xid AS TEXT) AS BIGINT) AS x FROM outbox WHERE seq = $1").bind(seq).fetch_one(db.pool()).await?;
    Ok(row.try_get("x")?)
}

async fn snapshot(db: &Db) -> anyhow::Result<String> {
    Ok(sqlx::query("SELECT CAST(pg_current_snapshot() AS TEXT) AS s").fetch_one(db.pool()).await?.try_get("s")?)
}

#[tokio::test]
async fn postgres_cursor_steps_and_a_late_commit() -> anyhow::Result<()> {
    let (_test_db, db) = setup(true).await?;
    let a = commit_one(&db, "a").await?;
    // `late` takes its transaction id before `b` and `c` but commits after
    // the step's snapshot: it belongs to the next step.
    let mut late = db.begin().await?;
    append(&mut late, "late").await?;
    let b = commit_one(&db, "b").await?;
    commit_one(&db, "c").await?;
    let hi = snapshot(&db).await?;
    late.commit().await?;
    commit_one(&db, "after").await?;
    assert_eq!(statuses(&db).await?, expect(&[("a", PENDING), ("b", PENDING), ("c", PENDING), ("late", PENDING), ("after", PENDING)]));

    // Within the step: done up to `b`.
    let within = Cursor { lo: "1:1:".into(), hi: Some(hi.clone()), xid: xid_of(&db, b).await?, seq: b };
    set_cursor(&db, &within).await?;
    assert_eq!(statuses(&db).await?, expect(&[("a", DELIVERED), ("b", DELIVERED), ("c", PENDING), ("late", PENDING), ("after", PENDING)]));
    assert_eq!(outbox::count_by_status(&db, DELIVERED).await?, 2);
    assert_eq!(delivered::count_except(&db, DELIVERED).await?, 3);

    // A settled filter taken now selects what the cursor passed now, and
    // keeps selecting exactly that after the cursor moves on.
    let mut conn = db.pool().acquire().await?;
    let settled = Settled { before_ms: 0, cursors: delivered::cursors(&mut conn).await? };
    drop(conn);
    assert_eq!(settled_ids(&db, &settled).await?, ["a", "b"]);

    // The step done: everything its snapshot saw, never the late commit.
    set_cursor(&db, &Cursor { lo: hi.clone(), hi: None, xid: 0, seq: 0 }).await?;
    assert_eq!(
        statuses(&db).await?,
        expect(&[("a", DELIVERED), ("b", DELIVERED), ("c", DELIVERED), ("late", PENDING), ("after", PENDING)])
    );
    assert_eq!(settled_ids(&db, &settled).await?, ["a", "b"]);

    // Exceptions keep their status; a row marked by an older release stays delivered.
    sqlx::query("UPDATE outbox SET status = $1 WHERE seq = $2").bind(FAILED).bind(a).execute(db.pool()).await?;
    sqlx::query("UPDATE outbox SET status = 'delivered', delivered_at_ms = 5 WHERE event_id = 'after'").execute(db.pool()).await?;
    assert_eq!(statuses(&db).await?, expect(&[("a", FAILED), ("b", DELIVERED), ("c", DELIVERED), ("late", PENDING), ("after", DELIVERED)]));
    let older = Settled { before_ms: 6, cursors: settled.cursors.clone() };
    assert_eq!(settled_ids(&db, &older).await?, ["after", "b"], "a set-aside row is not delivered; a dated one is, before its date");
    Ok(())
}

#[tokio::test]
async fn sqlite_cursor_is_the_sequence() -> anyhow::Result<()> {
    let (_test_db, db) = setup(false).await?;
    assert_eq!(db.backend(), Backend::Sqlite);
    let _a = commit_one(&db, "a").await?;
    let b = commit_one(&db, "b").await?;
    commit_one(&db, "c").await?;
    set_cursor(&db, &Cursor { lo: "1:1:".into(), hi: None, xid: 0, seq: b }).await?;
    assert_eq!(statuses(&db).await?, expect(&[("a", DELIVERED), ("b", DELIVERED), ("c", PENDING)]));
    let mut conn = db.pool().acquire().await?;
    let settled = Settled { before_ms: 0, cursors: delivered::cursors(&mut conn).await? };
    drop(conn);
    assert_eq!(settled_ids(&db, &settled).await?, ["a", "b"]);
    set_cursor(&db, &Cursor { lo: "1:1:".into(), hi: None, xid: 0, seq: b + 1 }).await?;
    assert_eq!(outbox::count_by_status(&db, DELIVERED).await?, 3);
    assert_eq!(settled_ids(&db, &settled).await?, ["a", "b"]);
    Ok(())
}
