//! One fresh database per test, on PostgreSQL and on SQLite.
//!
//! Every test gets a database of its own rather than a schema or a
//! transaction that is rolled back: the code under test opens its own pools,
//! commits, and runs claims with `FOR UPDATE SKIP LOCKED` from several
//! connections, which only behaves as in production on a real, separate
//! database.

use std::time::Duration;

use anyhow::Context as _;
use sqlx::{Connection as _, Executor as _, PgConnection};
use tempfile::TempDir;
use url::Url;

/// Environment variable holding the URL of the PostgreSQL server for tests.
pub const DATABASE_URL_ENV: &str = "HERALD_TEST_DATABASE_URL";

/// A database created for one test.
///
/// Keep it alive for as long as the test uses [`TestDb::url`]: for SQLite it
/// owns the temporary directory holding the file, which is deleted on drop.
/// PostgreSQL databases are not dropped: the cluster `scripts/test` starts is
/// itself thrown away at the end of the run, and a database left behind by a
/// failing test is something one can still look into.
#[derive(Debug)]
pub struct TestDb {
    /// Connection URL for sqlx (`postgres://…` or `sqlite://…`).
    pub url: String,
    _dir: Option<TempDir>,
}

impl TestDb {
    /// Whether this is a PostgreSQL database, for tests that run on both
    /// backends and must check backend-specific behaviour.
    pub fn is_postgres(&self) -> bool {
        self.url.starts_with("postgres")
    }
}

/// A fresh, empty PostgreSQL database `herald_test_<uuid>` on the server named
/// by `HERALD_TEST_DATABASE_URL`.
///
/// Migrations are not applied: tests of migrating need an empty database, and
/// the others apply them through Herald's own code, as production does.
pub async fn postgres_db() -> anyhow::Result<TestDb> {
    let base = std::env::var(DATABASE_URL_ENV).ok().filter(|url| !url.trim().is_empty()).with_context(|| {
        format!(
            "{DATABASE_URL_ENV} is not set: run the tests with scripts/test, \
                 which starts PostgreSQL"
        )
    })?;
    let name = format!("herald_test_{}", uuid::Uuid::new_v4().simple());

    let mut admin = PgConnection::connect(&base).await.with_context(|| format!("connecting to {DATABASE_URL_ENV}={base}"))?;
    create_database(&mut admin, &name).await?;
    admin.close().await.ok();

    let mut url = Url::parse(&base).with_context(|| format!("parsing {DATABASE_URL_ENV}"))?;
    url.set_path(&name);
    Ok(TestDb { url: url.into(), _dir: None })
}

/// `CREATE DATABASE`, retried briefly when PostgreSQL reports the template
/// database busy (SQLSTATE 55006): the copy needs the template to itself, and
/// many tests create their databases at the same moment.
async fn create_database(admin: &mut PgConnection, name: &str) -> anyhow::Result<()> {
    // `name` is ours (letters, digits, underscore): quoting is enough.
    let sql = format!("CREATE DATABASE \"{name}\"");
    let mut attempt = 0u32;
    loop {
        match admin.execute(sql.as_str()).await {
            Ok(_) => return Ok(()),
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55006") && attempt < 20 => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
            }
            Err(e) => return Err(e).with_context(|| format!("creating database {name}")),
        }
    }
}

/// A fresh SQLite database file in its own temporary directory.
///
/// A file rather than `sqlite::memory:`: Herald opens pools of several
/// connections, and each in-memory connection would see a database of its
/// own. `mode=rwc` lets the first connection create the file.
pub fn sqlite_db() -> anyhow::Result<TestDb> {
    let dir = tempfile::Builder::new().prefix("herald-test-").tempdir().context("creating a temporary directory for SQLite")?;
    let path = dir.path().join("herald.db");
    let path = path.to_str().with_context(|| format!("temporary path is not UTF-8: {}", path.display()))?;
    Ok(TestDb { url: format!("sqlite://{path}?mode=rwc"), _dir: Some(dir) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sqlite_db_is_a_usable_file_removed_on_drop() -> anyhow::Result<()> {
        let db = sqlite_db()?;
        let mut conn = sqlx::SqliteConnection::connect(&db.url).await?;
        conn.execute("CREATE TABLE t (x INTEGER)").await?;
        conn.close().await?;
        let file = db.url.trim_start_matches("sqlite://").trim_end_matches("?mode=rwc").to_owned();
        assert!(std::path::Path::new(&file).exists());
        assert!(!db.is_postgres());
        drop(db);
        assert!(!std::path::Path::new(&file).exists());
        Ok(())
    }

    #[tokio::test]
    async fn postgres_dbs_are_fresh_and_distinct() -> anyhow::Result<()> {
        if std::env::var(DATABASE_URL_ENV).is_err() {
            let err = postgres_db().await.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("scripts/test"), "{err}");
            return Ok(());
        }
        let (a, b) = tokio::try_join!(postgres_db(), postgres_db())?;
        assert_ne!(a.url, b.url);
        assert!(a.is_postgres());
        let mut conn = PgConnection::connect(&a.url).await?;
        let (name,): (String,) = sqlx::query_as("SELECT current_database()").fetch_one(&mut conn).await?;
        assert!(a.url.contains(&name) && name.starts_with("herald_test_"));
        conn.close().await?;
        Ok(())
    }
}
