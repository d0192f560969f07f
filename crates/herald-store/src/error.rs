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
            // A protocol error is a connection that broke mid-message (a
            // proxy or a failover cutting it), not a bad statement.
            E::Io(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed | E::Tls(_) | E::Protocol(_) => StoreError::Unavailable(e),
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
/// outcome unknown (40003), insufficient resources (53: disk full, out of
/// memory, too many connections), lock not available, statement cancelled (a
/// timeout), admin or crash shutdown, cannot connect now and idle-session
/// timeout (57P0x), system I/O errors (58); and a read-only transaction
/// (25006) or an idle-in-transaction timeout (25P03), which is what a
/// session meets when a failover left it on a standby or cut it off.
fn postgres_transient(sqlstate: &str) -> bool {
    matches!(&sqlstate[..2], "08" | "53" | "58")
        || matches!(sqlstate, "25006" | "25P03" | "40001" | "40003" | "40P01" | "55P03" | "57014")
        || sqlstate.starts_with("57P0")
}

/// SQLite, by primary code (the low byte of an extended code): busy, locked,
/// out of memory, read-only (a file or directory whose permissions changed,
/// a read-only remount), I/O error, disk full, cannot open (a volume not yet
/// mounted), WAL protocol race.
fn sqlite_transient(code: u32) -> bool {
    matches!(code & 0xff, 5 | 6 | 7 | 8 | 10 | 13 | 14 | 15)
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

    #[test]
    fn a_read_only_transaction_after_a_failover_is_transient() {
        // read_only_sql_transaction, idle_in_transaction_session_timeout,
        // idle_session_timeout, transaction outcome unknown.
        for code in ["25006", "25P03", "57P05", "40003"] {
            assert!(is_transient(Some(code)), "{code} should be retried");
        }
    }

    #[test]
    fn sqlite_read_only_and_cannot_open_are_transient() {
        // READONLY and its extended codes (RECOVERY, CANTLOCK, ROLLBACK,
        // DBMOVED, DIRECTORY); CANTOPEN and CANTOPEN_ISDIR…; PROTOCOL.
        for code in ["8", "264", "520", "776", "1032", "1544", "14", "270", "526", "15"] {
            assert!(is_transient(Some(code)), "sqlite {code} should be retried");
        }
    }

    #[test]
    fn a_protocol_error_is_unavailable() {
        let error = super::StoreError::from(sqlx::Error::Protocol("unexpected message during failover".into()));
        assert!(error.is_retryable(), "{error}");
    }
}
