//! Test harness for Herald: databases, brokers and small synchronisation aids.
//!
//! The integration tests run the thin path on real backends, not on fakes:
//! PostgreSQL and SQLite through sqlx, and Apache Kafka (a three-node KRaft
//! cluster) besides librdkafka's in-process mock cluster. This crate gives
//! every test its own, empty piece of those backends so tests can run in
//! parallel and never see each other's rows, topics or consumer groups.
//!
//! The shared services are not started here. `scripts/test` (and `.ci/run`,
//! which calls it) starts a private PostgreSQL cluster and a three-node Kafka
//! cluster once for the whole run and hands them over in environment
//! variables; a test that kills brokers starts a cluster of its own
//! ([`cluster::start`]) instead of disturbing the shared one. Starting
//! them per test binary would multiply a slow start-up by the number of test
//! binaries. A test that needs one of them and finds the variable unset fails
//! with a message that says how to run it, instead of being skipped silently:
//! a skipped test looks like a passing one.

pub mod cluster;
mod db;
pub mod docs;
pub mod kafka;
mod proxy;
mod secure;
mod sync;

pub use db::{DATABASE_URL_ENV, TestDb, postgres_db, sqlite_db};
pub use proxy::CutProxy;
pub use secure::{PostgresTls, SecureBroker, postgres_tls, secure_broker, with_tls};
pub use sync::{Gate, wait_until};

/// Environment variable holding the bootstrap servers of the real broker.
pub const KAFKA_BROKERS_ENV: &str = "HERALD_TEST_KAFKA_BROKERS";

/// Bootstrap servers of the shared Apache Kafka cluster started by
/// `scripts/test`.
///
/// The broker is shared by every test of the run, so tests must create their
/// own topics and use their own consumer groups (see [`unique`]); the broker
/// does not auto-create topics.
pub fn real_broker() -> anyhow::Result<String> {
    match std::env::var(KAFKA_BROKERS_ENV) {
        Ok(brokers) if !brokers.trim().is_empty() => Ok(brokers),
        _ => anyhow::bail!(
            "{KAFKA_BROKERS_ENV} is not set: run the tests with scripts/test, \
             which starts the Kafka cluster"
        ),
    }
}

/// Environment variable holding the endpoint of the S3-compatible server.
pub const S3_ENDPOINT_ENV: &str = "HERALD_TEST_S3_ENDPOINT";

/// Endpoint of the S3-compatible server (moto) started by `scripts/test`.
pub fn s3_endpoint() -> anyhow::Result<String> {
    match std::env::var(S3_ENDPOINT_ENV) {
        Ok(endpoint) if !endpoint.trim().is_empty() => Ok(endpoint),
        _ => anyhow::bail!("{S3_ENDPOINT_ENV} is not set: run the tests with scripts/test, which starts moto_server"),
    }
}

/// `prefix` followed by a short random suffix, e.g. `export.commands-3f9a1c2e`.
///
/// Topics and consumer groups on the shared broker outlive the test that made
/// them, and a group keeps its partitions until its session times out: a
/// fresh name per test keeps tests, and reruns of a test, from stepping on
/// each other. Eight hex digits are plenty for one run and keep names
/// readable in broker logs. The result only uses characters Kafka accepts in
/// topic names when `prefix` does.
pub fn unique(prefix: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}", &id[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_differ_and_keep_the_prefix() {
        let a = unique("herald.search");
        let b = unique("herald.search");
        assert_ne!(a, b);
        assert!(a.starts_with("herald.search-"));
        assert_eq!(a.len(), "herald.search-".len() + 8);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')));
    }

    #[test]
    fn real_broker_is_handed_over_by_the_test_script() -> anyhow::Result<()> {
        // Under scripts/test the variable is always set; elsewhere the error
        // must point at the script.
        match std::env::var(KAFKA_BROKERS_ENV) {
            Ok(expected) => assert_eq!(real_broker()?, expected),
            Err(_) => {
                let err = real_broker().err().map(|e| e.to_string()).unwrap_or_default();
                assert!(err.contains("scripts/test"), "{err}");
            }
        }
        Ok(())
    }
}
