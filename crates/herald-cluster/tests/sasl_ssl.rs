//! The SASL_SSL listener against librdkafka, the client Herald uses: both
//! mechanisms let the right user in over a verified TLS connection, and a
//! wrong password or an unknown CA keeps a client out, for that reason.
//!
//! One single-node cluster serves every case: a JVM per case would cost
//! more than the cases themselves.

use std::path::Path;
use std::time::{Duration, Instant};

use herald_cluster::{Cluster, SecureListener};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Long enough for a TLS handshake and a SASL exchange on a loaded machine;
/// a refused client spends all of it retrying.
const TIMEOUT: Duration = Duration::from_secs(10);

#[test]
fn the_sasl_ssl_listener_admits_the_user_and_refuses_the_rest() {
    let home = herald_cluster::kafka_home_from_env().expect("HERALD_KAFKA_HOME");
    let dir = tempfile::Builder::new().prefix("herald-cluster-sasl-").tempdir().expect("tempdir");
    let cluster = Cluster::start(&home, dir.path(), 1).expect("starting the cluster");
    let secure = cluster.secure();
    assert_ne!(secure.bootstrap(), cluster.bootstrap(), "the SASL_SSL listener has a port of its own");

    for mechanism in ["SCRAM-SHA-512", "PLAIN"] {
        let metadata = client(secure, mechanism, secure.password(), secure.ca_path())
            .fetch_metadata(None, TIMEOUT)
            .unwrap_or_else(|e| panic!("{mechanism} with the right password: {e}"));
        // The broker named in the metadata is the one advertised for the
        // listener the client came in through, not the PLAINTEXT one.
        let brokers: Vec<String> = metadata.brokers().iter().map(|b| format!("{}:{}", b.host(), b.port())).collect();
        assert_eq!(brokers, [secure.bootstrap()], "{mechanism}");
    }

    // Each refusal waits out the whole timeout: side by side, not in turn.
    std::thread::scope(|s| {
        for mechanism in ["SCRAM-SHA-512", "PLAIN"] {
            s.spawn(move || refused(secure, mechanism, "not-the-password", secure.ca_path(), RDKafkaErrorCode::Authentication));
        }
        s.spawn(|| refused(secure, "SCRAM-SHA-512", secure.password(), secure.untrusted_ca_path(), RDKafkaErrorCode::SSL));
    });
}

fn client(secure: &SecureListener, mechanism: &str, password: &str, ca: &Path) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", secure.bootstrap())
        .set("security.protocol", "SASL_SSL")
        .set("sasl.mechanism", mechanism)
        .set("sasl.username", secure.username())
        .set("sasl.password", password)
        .set("ssl.ca.location", ca.display().to_string())
        // librdkafka's default, set so that a change of default cannot turn
        // hostname verification off under these tests.
        .set("ssl.endpoint.identification.algorithm", "https")
        .set("log_level", "0")
        .create()
        .expect("creating a client")
}

/// Asserts that the client gets no metadata and that librdkafka reported
/// `why` meanwhile: a refused password and a refused certificate look the
/// same to `fetch_metadata`.
fn refused(secure: &SecureListener, mechanism: &str, password: &str, ca: &Path, why: RDKafkaErrorCode) {
    let client = client(secure, mechanism, password, ca);
    let case = format!("{mechanism} trusting {}", ca.display());
    assert!(client.fetch_metadata(None, TIMEOUT).is_err(), "{case}: let in");
    // The errors wait in the client's queue; a poll hands over one at a time.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        if let Some(Err(KafkaError::MessageConsumption(code))) = client.poll(Duration::from_millis(100)) {
            if code == why {
                return;
            }
            seen.push(code);
        }
    }
    panic!("{case}: refused, but no {why:?} error among {seen:?}");
}
