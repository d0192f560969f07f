use thiserror::Error;

/// A database failure, classified by what the caller should do about it.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The database is unreachable, busy or the transaction lost a race it may
    /// win next time: retry with backoff; nothing was committed.
    #[error("database unavailable, retry: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// The URL or the schema is wrong: fix the configuration, do not retry.
    #[error("database misconfigured: {0}")]
    Config(String),
    /// A query failed in a way retrying will not fix (constraint, type, SQL):
    /// a defect or bad data; reject the operation.
    #[error("database query failed: {0}")]
    Query(#[source] sqlx::Error),
}

impl StoreError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        use sqlx::Error as E;
        match &e {
            E::Io(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed | E::Tls(_) => {
                StoreError::Unavailable(e)
            }
            E::Database(db) if is_transient(db.code().as_deref()) => StoreError::Unavailable(e),
            E::Configuration(_) | E::Migrate(_) => StoreError::Config(e.to_string()),
            _ => StoreError::Query(e),
        }
    }
}

/// Codes that mean "try again": Postgres serialization failure, deadlock,
/// admin shutdown, cannot connect now; SQLite busy/locked.
fn is_transient(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("40001" | "40P01" | "57P01" | "57P03" | "5" | "6" | "517" | "261" | "262")
    )
}
