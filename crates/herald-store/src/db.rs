use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use herald_secret::SecretUrl;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::migrate::MigrateError;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{AnyPool, Executor};

use crate::StoreError;
use crate::appended::Appended;

/// A session setting for [`Db::native_postgres_with`]: every statement
/// keeps the generic plan it is prepared with. For statements whose plan
/// is the same index scan whatever their parameters, which PostgreSQL
/// otherwise plans again on every execution when it estimates the
/// generic plan dearer than custom ones (the relay's read at 1,000
/// events/s: 13,786 plans in 10 s, seven times the reads' own time).
pub const PLAN_ONCE: (&str, &str) = ("plan_cache_mode", "force_generic_plan");

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
    url: SecretUrl,
    appended: Arc<Appended>,
}

static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");
static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

impl Db {
    /// Connects to `url` (`postgres://…` or `sqlite://…`).
    /// Errors name the URL without its password.
    pub async fn connect(url: &str) -> Result<Db, StoreError> {
        sqlx::any::install_default_drivers();
        let url = SecretUrl::new(url);
        let backend = backend_of(&url)?;
        let options = connect_options(&url)?;
        let pool = match backend {
            Backend::Postgres => AnyPoolOptions::new().max_connections(16),
            // SQLite has one writer. One connection per process turns writer
            // contention into queueing instead of SQLITE_BUSY errors midway
            // through a transaction; the embedded default is one process.
            // `synchronous = FULL`: in WAL mode NORMAL can lose the last
            // acknowledged commits on a power loss, and an acknowledged intake
            // or a committed effect must survive one (BENCHMARKS.md, "SQLite
            // durability": about 7× fewer single-row commits per second).
            Backend::Sqlite => AnyPoolOptions::new().max_connections(1).after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute(
                        "PRAGMA journal_mode = WAL; PRAGMA busy_timeout = 10000; PRAGMA foreign_keys = ON; PRAGMA synchronous = FULL;",
                    )
                    .await?;
                    Ok(())
                })
            }),
        }
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .map_err(refused_at_connect)?;
        Ok(Db { pool, backend, url, appended: Arc::default() })
    }

    /// A pool of its own for the HTTP API on PostgreSQL: at most
    /// `connections` sessions, each with `statement_timeout` and plans made
    /// for each statement's parameters, so a flood of
    /// expensive requests waits for (or times out on) its own connections
    /// instead of taking the ones the relay and the subscriptions need. On
    /// SQLite, which has one writer and the embedded default's single
    /// process, the same pool (no statement timeout exists there).
    pub async fn api_pool(&self, connections: u32, statement_timeout: Duration) -> Result<Db, StoreError> {
        if self.backend == Backend::Sqlite {
            return Ok(self.clone());
        }
        let options = connect_options(&self.url)?;
        let timeout_ms = statement_timeout.as_millis();
        let pool = AnyPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(statement_timeout.max(Duration::from_secs(1)))
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    conn.execute(format!("SET statement_timeout = {timeout_ms}").as_str()).await?;
                    // The API's reads are parameter-sensitive: whether
                    // search's pattern has trigrams decides between the
                    // trigram index and the caller's own rows. A generic
                    // plan (chosen after five executions of a prepared
                    // statement) picks one for all patterns, and a
                    // two-letter text then reads the whole trigram index:
                    // 0.7 s instead of 1 ms over a million documents.
                    conn.execute("SET plan_cache_mode = force_custom_plan").await?;
                    Ok(())
                })
            })
            .connect_with(options)
            .await
            .map_err(refused_at_connect)?;
        Ok(Db { pool, backend: self.backend, url: self.url.clone(), appended: self.appended.clone() })
    }

    /// Connects and applies every pending migration of the backend: for
    /// `herald migrate`, the embedded default and scratch databases.
    pub async fn connect_and_migrate(url: &str) -> Result<Db, StoreError> {
        let db = Db::connect(url).await?;
        db.migrate().await?;
        Ok(db)
    }

    /// Connects and checks that this binary runs on the schema it finds
    /// ([`crate::schema::check`]): what every role does at start.
    pub async fn connect_checked(url: &str) -> Result<Db, StoreError> {
        let db = Db::connect(url).await?;
        crate::schema::check(&db).await?;
        Ok(db)
    }

    /// Applies every migration of this binary not applied yet. A schema a
    /// later release migrated is left alone: this binary cannot know what
    /// its migrations were, and applying its own would be out of order.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let found = crate::schema::found(self).await?;
        let knows = crate::schema::newest_known(self);
        if let Some(applied) = found.applied.filter(|applied| *applied > knows) {
            return Err(StoreError::Config(format!(
                "the database schema is at version {applied}, newer than this herald's {knows}: nothing applied (migrate with the newer release)"
            )));
        }
        let applied = match self.backend {
            Backend::Sqlite => self.migrator().run(&self.pool).await,
            Backend::Postgres => self.migrate_postgres().await,
        };
        applied.map_err(|e| StoreError::Config(format!("migration failed: {e}")))
    }

    /// A migration's lock request queues every later query of its table
    /// behind it; behind an open transaction that itself waits for one of
    /// those queries (a process's other connection), PostgreSQL sees no
    /// deadlock and everything waits. So each attempt gives up after
    /// [`MIGRATION_LOCK_TIMEOUT`], letting the queue drain, and tries again.
    async fn migrate_postgres(&self) -> Result<(), MigrateError> {
        let mut attempt = 1;
        loop {
            let mut conn = self.pool.acquire().await?;
            sqlx::query(&format!("SET lock_timeout = '{}ms'", MIGRATION_LOCK_TIMEOUT.as_millis())).execute(&mut *conn).await?;
            let outcome = self.migrator().run(&mut *conn).await;
            // The setting stays with the connection: it must not reach the
            // pool's other users.
            conn.close().await?;
            match outcome {
                Err(e) if attempt < MIGRATION_ATTEMPTS && lock_not_available(&e) => {
                    tracing::warn!(attempt, error = %e, "a migration waited too long for a lock; trying again");
                    tokio::time::sleep(MIGRATION_LOCK_TIMEOUT).await;
                    attempt += 1;
                }
                outcome => return outcome,
            }
        }
    }

    /// The migrations this binary ships for its backend.
    pub fn migrator(&self) -> &'static sqlx::migrate::Migrator {
        match self.backend {
            Backend::Postgres => &POSTGRES_MIGRATIONS,
            Backend::Sqlite => &SQLITE_MIGRATIONS,
        }
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL this pool was opened with, password included, for a
    /// dedicated connection such as a PostgreSQL `LISTEN`. Never log it: use
    /// [`Db::redacted_url`].
    pub fn url(&self) -> &str {
        self.url.expose()
    }

    /// The URL as it may be shown, without its password.
    pub fn redacted_url(&self) -> &str {
        self.url.redacted()
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

    /// One round trip: the database answers (readiness probes).
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// A transaction; on SQLite it takes the write lock at `BEGIN`. A
    /// deferred transaction that reads and then writes fails at once with
    /// "database is locked" when another process wrote in between (SQLite
    /// cannot upgrade its stale snapshot, and the busy timeout does not
    /// apply); taking the lock first makes that writer wait its turn instead.
    pub async fn begin(&self) -> Result<crate::Tx<'static>, StoreError> {
        Ok(match self.backend {
            Backend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => self.pool.begin().await?,
        })
    }

    /// A pool of sqlx's native PostgreSQL driver on the same database, for
    /// the hot paths that bind arrays (`Any` cannot): at most `connections`
    /// sessions, opened on first use, so an outage then fails that use
    /// (retryably) rather than this call. `None` on SQLite.
    ///
    /// A connection is not pinged when taken: sqlx already pings it when it
    /// comes back, and on a busy machine each round trip costs a batch more
    /// than its statement (BENCHMARKS.md, "Consume"); a connection that broke
    /// meanwhile fails the batch's first statement, which is retried.
    pub fn native_postgres(&self, connections: u32) -> Result<Option<PgPool>, StoreError> {
        self.native_postgres_with(connections, &[])
    }

    /// [`Db::native_postgres`] whose sessions start with `settings`
    /// (PostgreSQL run-time parameters, e.g. [`PLAN_ONCE`]).
    pub fn native_postgres_with(&self, connections: u32, settings: &[(&str, &str)]) -> Result<Option<PgPool>, StoreError> {
        match self.backend {
            Backend::Sqlite => Ok(None),
            Backend::Postgres => {
                let options = PgConnectOptions::from_str(self.url.expose())
                    .map_err(|e| StoreError::Config(format!("database URL `{}`: {e}", self.url)))?
                    .options(settings.iter().copied());
                Ok(Some(PgPoolOptions::new().max_connections(connections).test_before_acquire(false).connect_lazy_with(options)))
            }
        }
    }

    /// News of outbox rows committed through this process's handles
    /// ([`crate::outbox::announce`]), for its relay.
    pub fn appended(&self) -> &Appended {
        &self.appended
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// `url`'s connect options; an error names the URL without its password.
fn connect_options(url: &SecretUrl) -> Result<AnyConnectOptions, StoreError> {
    AnyConnectOptions::from_str(url.expose()).map_err(|e| StoreError::Config(format!("database URL `{url}`: {e}")))
}

/// A TLS failure while the pool opens is the configuration's fault (an
/// untrusted CA, a host name the certificate does not name, `sslmode`
/// demanding TLS of a server without it): retrying cannot help.
fn refused_at_connect(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::Tls(reason) => StoreError::Config(format!("TLS to the database failed: {reason}")),
        other => other.into(),
    }
}

fn backend_of(url: &SecretUrl) -> Result<Backend, StoreError> {
    let raw = url.expose();
    if raw.starts_with("postgres://") || raw.starts_with("postgresql://") {
        Ok(Backend::Postgres)
    } else if raw.starts_with("sqlite:") {
        Ok(Backend::Sqlite)
    } else {
        Err(StoreError::Config(format!("database URL `{url}` is neither postgres:// nor sqlite://")))
    }
}

/// Wall-clock time as stored in every `*_ms` column.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// How long one attempt of `herald migrate` waits for a table lock on
/// PostgreSQL before it lets the queries queued behind it through.
const MIGRATION_LOCK_TIMEOUT: Duration = Duration::from_secs(3);

/// Attempts before `herald migrate` reports the lock it could not get.
const MIGRATION_ATTEMPTS: u32 = 40;

/// PostgreSQL's `lock_not_available` (55P03): `lock_timeout` expired.
fn lock_not_available(e: &MigrateError) -> bool {
    let (MigrateError::Execute(e) | MigrateError::ExecuteMigration(e, _)) = e else { return false };
    e.as_database_error().and_then(|d| d.code()).as_deref() == Some("55P03")
}
