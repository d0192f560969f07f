//! The TLS and SASL side of the shared services `scripts/test` starts: each
//! Kafka node's SASL_SSL listener (herald-cluster makes its certificates and
//! SCRAM user) and the CA of PostgreSQL's certificate (the server runs with
//! `ssl=on`).

use std::path::PathBuf;

use anyhow::Context as _;

fn var(name: &str) -> anyhow::Result<String> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .with_context(|| format!("{name} is not set: run the tests with scripts/test, which starts the services with TLS"))
}

/// The shared cluster's SASL_SSL listeners and the credentials they accept.
#[derive(Debug, Clone)]
pub struct SecureBroker {
    /// Bootstrap servers of the SASL_SSL listeners.
    pub brokers: String,
    /// The CA that signed the brokers' certificate.
    pub ca: PathBuf,
    /// A CA that did not: a client trusting only it must refuse the brokers.
    pub untrusted_ca: PathBuf,
    /// A user known to SCRAM-SHA-512 and PLAIN alike.
    pub username: String,
    pub password: String,
}

impl SecureBroker {
    /// The `herald` flags that reach this listener with `mechanism`.
    pub fn flags(&self, mechanism: &str) -> Vec<String> {
        [
            "--kafka",
            &self.brokers,
            "--kafka-security-protocol",
            "sasl_ssl",
            "--kafka-sasl-mechanism",
            mechanism,
            "--kafka-sasl-username",
            &self.username,
            "--kafka-sasl-password",
            &self.password,
            "--kafka-ssl-ca",
            &self.ca.display().to_string(),
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// The same settings as `HERALD_*` variables, as a deployment sets them.
    pub fn env(&self, mechanism: &str) -> Vec<(&'static str, String)> {
        vec![
            ("HERALD_KAFKA_BROKERS", self.brokers.clone()),
            ("HERALD_KAFKA_SECURITY_PROTOCOL", "sasl_ssl".to_owned()),
            ("HERALD_KAFKA_SASL_MECHANISM", mechanism.to_owned()),
            ("HERALD_KAFKA_SASL_USERNAME", self.username.clone()),
            ("HERALD_KAFKA_SASL_PASSWORD", self.password.clone()),
            ("HERALD_KAFKA_SSL_CA", self.ca.display().to_string()),
        ]
    }
}

/// The shared cluster's SASL_SSL side (`HERALD_TEST_KAFKA_SASL_*`).
pub fn secure_broker() -> anyhow::Result<SecureBroker> {
    Ok(SecureBroker {
        brokers: var("HERALD_TEST_KAFKA_SASL_BROKERS")?,
        ca: var("HERALD_TEST_KAFKA_CA")?.into(),
        untrusted_ca: var("HERALD_TEST_KAFKA_UNTRUSTED_CA")?.into(),
        username: var("HERALD_TEST_KAFKA_SASL_USERNAME")?,
        password: var("HERALD_TEST_KAFKA_SASL_PASSWORD")?,
    })
}

/// PostgreSQL's certificate authority and an unrelated one.
#[derive(Debug, Clone)]
pub struct PostgresTls {
    pub ca: PathBuf,
    pub untrusted_ca: PathBuf,
}

/// `HERALD_TEST_PG_CA` and `HERALD_TEST_PG_UNTRUSTED_CA`.
pub fn postgres_tls() -> anyhow::Result<PostgresTls> {
    Ok(PostgresTls { ca: var("HERALD_TEST_PG_CA")?.into(), untrusted_ca: var("HERALD_TEST_PG_UNTRUSTED_CA")?.into() })
}

/// `url` (a test database) with TLS settings added as query parameters.
pub fn with_tls(url: &str, sslmode: &str, root_cert: Option<&std::path::Path>) -> anyhow::Result<String> {
    let mut url = url::Url::parse(url)?;
    url.query_pairs_mut().append_pair("sslmode", sslmode);
    if let Some(cert) = root_cert {
        url.query_pairs_mut().append_pair("sslrootcert", &cert.display().to_string());
    }
    Ok(url.into())
}
