use std::str::FromStr;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, Executor};

use crate::StoreError;

/// Which database is behind a [`Db`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// A pool on Herald's database, migrated or ready to be.
#[derive(Debug, Clone)]
pub struct Db {
    pool: AnyPool,
    backend: Backend,
    url: String,
}

static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");
static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

impl Db {
    /// Connects to `url` (`postgres://…` or `sqlite://…`).
    pub async fn connect(url: &str) -> Result<Db, StoreError> {
        sqlx::any::install_default_drivers();
        let backend = backend_of(url)?;
        let options = AnyConnectOptions::from_str(url).map_err(|e| StoreError::Config(format!("database URL `{url}`: {e}")))?;
        let pool = match backend {
            Backend::Postgres => AnyPoolOptions::new().max_connections(16),
            // SQLite has one writer. One connection per process turns writer
            // contention into queueing instead of SQLITE_BUSY errors midway
            // through a transaction; the embedded default is one process.
            Backend::Sqlite => AnyPoolOptions::new().max_connections(1).after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute(
                        "PRAGMA journal_mode = WAL; PRAGMA busy_timeout = 10000; PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL;",
                    )
                    .await?;
                    Ok(())
                })
            }),
        }
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await?;
        Ok(Db { pool, backend, url: url.to_owned() })
    }

    /// Connects and applies every pending migration of the backend.
    pub async fn connect_and_migrate(url: &str) -> Result<Db, StoreError> {
        let db = Db::connect(url).await?;
        db.migrate().await?;
        Ok(db)
    }

    pub async fn migrate(&self) -> Result<(), StoreError> {
        let migrator = match self.backend {
            Backend::Postgres => &POSTGRES_MIGRATIONS,
            Backend::Sqlite => &SQLITE_MIGRATIONS,
        };
        migrator.run(&self.pool).await.map_err(|e| StoreError::Config(format!("migration failed: {e}")))
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL this pool was opened with, for a dedicated connection such as
    /// a PostgreSQL `LISTEN`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// SQL for "now" in epoch milliseconds by the *database's* clock. Leases
    /// compare against it, so relays on hosts whose clocks disagree still
    /// agree on when a lease expired.
    pub fn now_sql(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
            Backend::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
        }
    }

    pub async fn begin(&self) -> Result<crate::Tx<'static>, StoreError> {
        Ok(self.pool.begin().await?)
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

fn backend_of(url: &str) -> Result<Backend, StoreError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Backend::Postgres)
    } else if url.starts_with("sqlite:") {
        Ok(Backend::Sqlite)
    } else {
        Err(StoreError::Config(format!("database URL `{url}` is neither postgres:// nor sqlite://")))
    }
}

/// Wall-clock time as stored in every `*_ms` column.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
