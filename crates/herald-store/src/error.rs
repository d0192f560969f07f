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
            E::Io(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed | E::Tls(_) => StoreError::Unavailable(e),
            E::Database(db) if is_transient(db.code().as_deref()) => StoreError::Unavailable(e),
            E::Configuration(_) | E::Migrate(_) => StoreError::Config(e.to_string()),
            _ => StoreError::Query(e),
        }
    }
}

/// Codes that mean "try again": the database could not do the work now, and
/// the same statement may succeed later unchanged. Anything else is a defect
/// or bad data. Getting this wrong in the "permanent" direction would
/// dead-letter good records during an outage (a full disk, say), so whole
/// classes of resource and connection failures count as transient.
fn is_transient(code: Option<&str>) -> bool {
    let Some(code) = code else { return false };
    // A SQLSTATE is always five characters; SQLite's (extended) codes are
    // decimal numbers below 10 000.
    if code.len() == 5 {
        return postgres_transient(code);
    }
    code.parse::<u32>().is_ok_and(sqlite_transient)
}

/// Postgres: connection exceptions (08), serialization failure and deadlock,
/// insufficient resources (53: disk full, out of memory, too many
/// connections), lock not available, statement cancelled (a timeout), admin
/// or crash shutdown and cannot connect now (57P0x), system I/O errors (58).
fn postgres_transient(sqlstate: &str) -> bool {
    matches!(&sqlstate[..2], "08" | "53" | "58")
        || matches!(sqlstate, "40001" | "40P01" | "55P03" | "57014" | "57P01" | "57P02" | "57P03" | "57P04")
}

/// SQLite, by primary code (the low byte of an extended code): busy, locked,
/// out of memory, I/O error, disk full.
fn sqlite_transient(code: u32) -> bool {
    matches!(code & 0xff, 5 | 6 | 7 | 10 | 13)
}

#[cfg(test)]
mod tests {
    use super::is_transient;

    #[test]
    fn outages_are_transient_and_bad_statements_are_not() {
        // Postgres: disk full, too many connections, connection lost,
        // deadlock, serialization, statement timeout, shutdown.
        for code in ["53100", "53300", "08006", "40P01", "40001", "57014", "57P01", "58030"] {
            assert!(is_transient(Some(code)), "{code} should be retried");
        }
        // Postgres: unique violation, syntax error, undefined table, bad value.
        for code in ["23505", "42601", "42P01", "22P02"] {
            assert!(!is_transient(Some(code)), "{code} should not be retried");
        }
        // SQLite: busy, busy snapshot, locked shared cache, I/O error (read), full.
        for code in ["5", "517", "262", "266", "13"] {
            assert!(is_transient(Some(code)), "sqlite {code} should be retried");
        }
        // SQLite: primary key and unique constraint, plain error.
        for code in ["1555", "2067", "1"] {
            assert!(!is_transient(Some(code)), "sqlite {code} should not be retried");
        }
        assert!(!is_transient(None));
    }
}
