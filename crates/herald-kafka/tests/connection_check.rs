//! The start-up check against the shared cluster's SASL_SSL listeners: the
//! right credentials pass, a wrong password and an untrusted CA are refused
//! as such, well before the check's deadline (librdkafka alone would retry
//! them for ever), and a port nobody listens on is "unreachable" once the
//! deadline passes.

use std::time::{Duration, Instant};

use herald_kafka::{ConnectError, KafkaConfig, check_connection};
use herald_testkit::{SecureBroker, secure_broker};

const WITHIN: Duration = Duration::from_secs(60);

fn secure(broker: &SecureBroker, mechanism: &str, password: &str, ca: &std::path::Path) -> KafkaConfig {
    KafkaConfig::new(&broker.brokers)
        .with("security.protocol", "sasl_ssl")
        .with("sasl.mechanism", mechanism)
        .with("sasl.username", &broker.username)
        .with("sasl.password", password)
        .with("ssl.ca.location", ca.display().to_string())
}

#[tokio::test]
async fn the_right_credentials_pass_with_scram_and_plain() -> anyhow::Result<()> {
    let broker = secure_broker()?;
    for mechanism in ["SCRAM-SHA-512", "PLAIN"] {
        check_connection(&secure(&broker, mechanism, &broker.password, &broker.ca), WITHIN).await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_wrong_password_is_refused_before_the_deadline() -> anyhow::Result<()> {
    let broker = secure_broker()?;
    for mechanism in ["SCRAM-SHA-512", "PLAIN"] {
        let started = Instant::now();
        let outcome = check_connection(&secure(&broker, mechanism, "not-the-password", &broker.ca), WITHIN).await;
        assert!(matches!(outcome, Err(ConnectError::Authentication(_))), "{mechanism}: {outcome:?}");
        assert!(started.elapsed() < WITHIN, "{mechanism}: refused at once, not after the deadline");
    }
    Ok(())
}

#[tokio::test]
async fn an_untrusted_ca_is_refused_before_the_deadline() -> anyhow::Result<()> {
    let broker = secure_broker()?;
    let started = Instant::now();
    let outcome = check_connection(&secure(&broker, "SCRAM-SHA-512", &broker.password, &broker.untrusted_ca), WITHIN).await;
    assert!(matches!(outcome, Err(ConnectError::Tls(_))), "{outcome:?}");
    assert!(started.elapsed() < WITHIN);
    Ok(())
}

#[tokio::test]
async fn settings_librdkafka_rejects_are_a_settings_error() -> anyhow::Result<()> {
    let broker = secure_broker()?;
    let missing_ca = std::env::temp_dir().join(format!("no-such-ca-{}.pem", std::process::id()));
    let outcome = check_connection(&secure(&broker, "SCRAM-SHA-512", &broker.password, &missing_ca), WITHIN).await;
    assert!(matches!(outcome, Err(ConnectError::Settings(_))), "{outcome:?}");
    Ok(())
}

#[tokio::test]
async fn nobody_listening_is_unreachable_after_the_deadline() -> anyhow::Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let within = Duration::from_secs(2);
    let outcome = check_connection(&KafkaConfig::new(format!("127.0.0.1:{port}")), within).await;
    match outcome {
        Err(e @ ConnectError::Unreachable { .. }) => assert!(!e.is_configuration()),
        other => panic!("expected unreachable, got {other:?}"),
    }
    Ok(())
}
