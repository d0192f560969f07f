//! The lease primitive on PostgreSQL and SQLite, on a table of its own (the
//! users' tables are theirs to test): take, renew, expiry by the database's
//! clock, fenced writes refused, release, and both kinds of token.

use herald_store::Db;
use herald_store::lease::{self, Held, LeaseTable, Pick, Take, Token, TokenKind, Value, Write};
use herald_testkit::{Gate, TestDb};
use sqlx::Row;

/// Leases with minted tokens.
const MINTED: LeaseTable = LeaseTable {
    table: "lease_rows",
    key: "id",
    owner: "owner",
    token: "token",
    expires_at: "expires_at_ms",
    token_kind: TokenKind::Minted,
    released: "NULL",
};

/// The same rows leased under a counter (a generation).
const COUNTED: LeaseTable = LeaseTable { token: "generation", token_kind: TokenKind::Counter, ..MINTED };

const ROWS: i64 = 8;

async fn setup(postgres: bool) -> anyhow::Result<(TestDb, Db)> {
    let test_db = if postgres { herald_testkit::postgres_db().await? } else { herald_testkit::sqlite_db()? };
    let db = Db::connect(&test_db.url).await?;
    sqlx::query(
        "CREATE TABLE lease_rows (id TEXT PRIMARY KEY, owner TEXT, token TEXT, expires_at_ms BIGINT, \
         generation BIGINT NOT NULL DEFAULT 0, note TEXT, takes BIGINT NOT NULL DEFAULT 0)",
    )
    .execute(db.pool())
    .await?;
    for i in 0..ROWS {
        sqlx::query("INSERT INTO lease_rows (id) VALUES ($1)").bind(format!("r{i}")).execute(db.pool()).await?;
    }
    Ok((test_db, db))
}

fn take_key<'a>(owner: &'a str, key: &'a Value, ttl_ms: i64) -> Take<'a> {
    Take {
        owner: Some(owner),
        ttl_ms,
        pick: Pick::Key(key),
        eligible: None,
        free: Some("owner IS NULL"),
        set: Some("takes = takes + 1"),
        returning: "id, token, generation, expires_at_ms, takes",
        binds: 0,
    }
}

/// Takes row `key` for `owner`; `None` when it is held by someone else.
async fn take(db: &Db, table: &LeaseTable, owner: &str, key: &str, ttl_ms: i64) -> anyhow::Result<Option<Held>> {
    let key = Value::from(key);
    let statement = table.take(db, &take_key(owner, &key, ttl_ms));
    let row = statement.plain().fetch_optional(db.pool()).await?;
    row.map(|row| held_from(table, &row)).transpose()
}

fn held_from(table: &LeaseTable, row: &sqlx::any::AnyRow) -> anyhow::Result<Held> {
    let token = match table.token_kind {
        TokenKind::Minted => Token::Text(row.try_get("token")?),
        TokenKind::Counter => Token::Counter(row.try_get("generation")?),
    };
    Ok(Held { key: Value::Text(row.try_get("id")?), token })
}

/// A fenced write of `note`; whether it happened.
async fn write_note(db: &Db, table: &LeaseTable, held: &Held, note: &str, unexpired: bool) -> anyhow::Result<bool> {
    let statement = table.write(db, held, &Write { set: "note = $1", unexpired, binds: 1, ..Write::default() });
    Ok(statement.query(|q| q.bind(note)).execute(db.pool()).await?.rows_affected() == 1)
}

async fn expires_at(db: &Db, key: &str) -> anyhow::Result<Option<i64>> {
    Ok(sqlx::query("SELECT expires_at_ms FROM lease_rows WHERE id = $1").bind(key).fetch_one(db.pool()).await?.try_get("expires_at_ms")?)
}

/// Moves a lease's expiry relative to the database's clock — how a test lets
/// time pass for a lease without waiting for it.
async fn expire_in(db: &Db, key: &str, ms: i64) -> anyhow::Result<()> {
    let sql = format!("UPDATE lease_rows SET expires_at_ms = {} + $1 WHERE id = $2", db.now_sql());
    sqlx::query(&sql).bind(ms).bind(key).execute(db.pool()).await?;
    Ok(())
}

async fn take_renew_release(postgres: bool) -> anyhow::Result<()> {
    let (_keep, db) = setup(postgres).await?;
    let before = lease::db_now(&db).await?;
    let a = take(&db, &MINTED, "a", "r0", 60_000).await?.expect("a free row is taken");
    let after = lease::db_now(&db).await?;
    let expiry = expires_at(&db, "r0").await?.expect("expiry");
    assert!((before + 60_000..=after + 60_000).contains(&expiry), "expiry {expiry} is the database's now + ttl ({before}..{after})");
    assert!(take(&db, &MINTED, "b", "r0", 60_000).await?.is_none(), "a held lease is not taken");

    // Renew: extends a held lease by the database's clock.
    expire_in(&db, "r0", 1_000).await?;
    let renewed = MINTED.write(&db, &a, &Write { extend_ms: Some(60_000), ..Write::default() });
    assert_eq!(renewed.plain().execute(db.pool()).await?.rows_affected(), 1);
    assert!(expires_at(&db, "r0").await?.expect("expiry") >= after + 60_000);
    assert!(write_note(&db, &MINTED, &a, "by a", true).await?);

    // Release: the row is free at once, and the old token fences nothing in.
    let release = MINTED.release(&a, None, None, 0);
    assert_eq!(release.plain().execute(db.pool()).await?.rows_affected(), 1);
    assert!(!write_note(&db, &MINTED, &a, "late", false).await?, "a released lease writes nothing");
    let b = take(&db, &MINTED, "b", "r0", 60_000).await?.expect("a released row is free");
    assert_ne!(a.token, b.token);
    let row = sqlx::query("SELECT owner, note, takes FROM lease_rows WHERE id = 'r0'").fetch_one(db.pool()).await?;
    assert_eq!(row.try_get::<String, _>("owner")?, "b");
    assert_eq!(row.try_get::<String, _>("note")?, "by a");
    assert_eq!(row.try_get::<i64, _>("takes")?, 2, "the extra SET ran with each take");
    Ok(())
}

async fn expiry_and_fences(postgres: bool) -> anyhow::Result<()> {
    let (_keep, db) = setup(postgres).await?;
    let a = take(&db, &MINTED, "a", "r1", 60_000).await?.expect("taken");
    let forged = Held { token: Token::Text("not-the-token".into()), ..a.clone() };
    assert!(!write_note(&db, &MINTED, &forged, "forged", false).await?, "a wrong token writes nothing");

    // Expired by the database's clock: the holder may no longer write where
    // the write needs an unexpired lease, nor renew; someone else may take it.
    expire_in(&db, "r1", -1).await?;
    assert!(!write_note(&db, &MINTED, &a, "expired", true).await?);
    assert_eq!(MINTED.renew_all(&db, std::slice::from_ref(&a), 60_000).plain().fetch_all(db.pool()).await?.len(), 0, "never revived");
    let renew = MINTED.write(&db, &a, &Write { extend_ms: Some(60_000), unexpired: true, ..Write::default() });
    assert_eq!(renew.plain().execute(db.pool()).await?.rows_affected(), 0, "nor by a single renew");
    assert!(write_note(&db, &MINTED, &a, "token only", false).await?, "a token-only write holds until someone takes the row");
    let b = take(&db, &MINTED, "b", "r1", 60_000).await?.expect("an expired lease is taken");
    assert!(!write_note(&db, &MINTED, &a, "after takeover", false).await?, "the old token is fenced out");
    assert!(write_note(&db, &MINTED, &b, "b", true).await?);

    // A lease that expires just ahead of the database's now is still held.
    expire_in(&db, "r1", 5_000).await?;
    assert!(take(&db, &MINTED, "c", "r1", 60_000).await?.is_none());
    let renewed = MINTED.renew_all(&db, &[b.clone(), forged], 60_000).plain().fetch_all(db.pool()).await?;
    let keys: Vec<String> = renewed.iter().map(|r| r.try_get("leased_key")).collect::<Result<_, _>>()?;
    assert_eq!(keys, vec!["r1".to_owned()], "only the held lease is renewed");
    Ok(())
}

async fn counter_tokens(postgres: bool) -> anyhow::Result<()> {
    let (_keep, db) = setup(postgres).await?;
    let first = take(&db, &COUNTED, "a", "r2", 60_000).await?.expect("taken");
    assert_eq!(first.token, Token::Counter(1));
    expire_in(&db, "r2", -1).await?;
    let second = take(&db, &COUNTED, "b", "r2", 60_000).await?.expect("taken after expiry");
    assert_eq!(second.token, Token::Counter(2));
    assert!(!write_note(&db, &COUNTED, &first, "stale", false).await?, "an older generation writes nothing");
    assert!(write_note(&db, &COUNTED, &second, "current", false).await?);
    let release = COUNTED.release(&second, None, None, 0);
    assert_eq!(release.plain().execute(db.pool()).await?.rows_affected(), 1);
    let row = sqlx::query("SELECT generation, owner FROM lease_rows WHERE id = 'r2'").fetch_one(db.pool()).await?;
    assert_eq!(row.try_get::<i64, _>("generation")?, 2, "a release keeps the counter");
    assert!(row.try_get::<Option<String>, _>("owner")?.is_none());
    Ok(())
}

/// Two takers of "the first rows" at the same instant get disjoint rows, and
/// nothing is left while the leases run.
async fn racing_takes_are_disjoint(postgres: bool) -> anyhow::Result<()> {
    let (keep, db) = setup(postgres).await?;
    let other = Db::connect(&keep.url).await?;
    let gate = Gate::new(2);
    let take_first = |db: Db, owner: &'static str, gate: Gate| async move {
        gate.arrive_and_wait().await;
        let take = Take {
            owner: Some(owner),
            ttl_ms: 60_000,
            pick: Pick::First { order_by: "id", limit: ROWS },
            eligible: Some("id <> $1"),
            free: Some("owner IS NULL"),
            set: None,
            returning: "id",
            binds: 1,
        };
        let statement = MINTED.take(&db, &take);
        let rows = statement.query(|q| q.bind("r7")).fetch_all(db.pool()).await?;
        rows.iter().map(|r| Ok(r.try_get::<String, _>("id")?)).collect::<anyhow::Result<Vec<String>>>()
    };
    let (got_a, got_b) = tokio::try_join!(take_first(db.clone(), "a", gate.clone()), take_first(other.clone(), "b", gate.clone()))?;
    let mut all: Vec<String> = got_a.iter().chain(&got_b).cloned().collect();
    all.sort();
    let before = all.len();
    all.dedup();
    assert_eq!(all.len(), before, "no row taken twice: a={got_a:?} b={got_b:?}");
    assert_eq!(all, (0..ROWS - 1).map(|i| format!("r{i}")).collect::<Vec<_>>(), "every eligible row taken once");
    assert!(take(&db, &MINTED, "c", "r0", 60_000).await?.is_none());
    assert!(take(&db, &MINTED, "c", "r7", 60_000).await?.is_some(), "the row the condition left out is still free");
    Ok(())
}

macro_rules! on_both {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread")]
            async fn postgres() -> anyhow::Result<()> {
                super::$name(true).await
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn sqlite() -> anyhow::Result<()> {
                super::$name(false).await
            }
        }
    };
}

on_both!(take_renew_release);
on_both!(expiry_and_fences);
on_both!(counter_tokens);
on_both!(racing_takes_are_disjoint);
