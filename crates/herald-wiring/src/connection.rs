//! How every command reaches the database and the Kafka cluster: one set of
//! flags (and `HERALD_*` variables), flattened into each command that needs
//! them, so a setting such as TLS or SASL is spelled once and applies to
//! every role.
//!
//! Secrets (the database URL, the SASL password, librdkafka properties
//! whose name says they hold one) are parsed straight into `herald_secret`
//! types and their variables' values are hidden from `--help`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use herald_kafka::{ConnectError, KafkaConfig};
use herald_secret::{Secret, SecretUrl};
use herald_store::{Db, StoreError};
use thiserror::Error;
use tracing::warn;

/// Configuration that cannot work as given: the binary prints it and exits 2.
#[derive(Debug, Error)]
#[error("{0}")]
pub struct BadConnection(pub String);

/// How long a role waits at start for a broker to answer before it starts
/// anyway; a refused password or certificate ends the wait at once.
pub const KAFKA_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Default, Args)]
pub struct DatabaseArgs {
    /// Database URL (postgres://… or sqlite://…). PostgreSQL over TLS:
    /// `?sslmode=verify-full&sslrootcert=/path/ca.pem` (also `require`,
    /// `verify-ca`; default `prefer`, as libpq).
    #[arg(long = "database", id = "database", env = "HERALD_DATABASE_URL", hide_env_values = true, global = true)]
    pub url: Option<SecretUrl>,
}

impl DatabaseArgs {
    /// The URL, or a usage error naming what needs it.
    pub fn require(&self, command: &str) -> Result<&SecretUrl, BadConnection> {
        self.url.as_ref().ok_or_else(|| BadConnection(format!("`{command}` needs --database (or HERALD_DATABASE_URL)")))
    }

    /// Opens the database `command` needs.
    pub async fn open(&self, command: &str, schema: Schema) -> anyhow::Result<Db> {
        open_database(self.require(command)?, schema).await
    }
}

/// What a command does about the database schema when it opens it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    /// Apply this release's migrations: `herald migrate`, and the embedded
    /// default that no other process shares.
    Migrate,
    /// Refuse a schema this release cannot run on (every role).
    Check,
    /// Neither: `herald migrate --dry-run`, which only looks.
    AsIs,
}

/// Opens `url`. A configuration the server refuses (TLS, an unknown scheme,
/// a schema this release cannot run on or migrate) is [`BadConnection`].
pub async fn open_database(url: &SecretUrl, schema: Schema) -> anyhow::Result<Db> {
    let opened = match schema {
        Schema::Migrate => Db::connect_and_migrate(url.expose()).await,
        Schema::Check => Db::connect_checked(url.expose()).await,
        Schema::AsIs => Db::connect(url.expose()).await,
    };
    opened.map_err(|e| match e {
        StoreError::Config(reason) => BadConnection(format!("database {url}: {reason}")).into(),
        other => anyhow::Error::new(other).context(format!("database {url}")),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SaslMechanism {
    #[value(name = "SCRAM-SHA-512")]
    ScramSha512,
    #[value(name = "SCRAM-SHA-256")]
    ScramSha256,
    #[value(name = "PLAIN")]
    Plain,
}

impl SaslMechanism {
    fn librdkafka(self) -> &'static str {
        match self {
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::Plain => "PLAIN",
        }
    }
}

#[derive(Debug, Clone, Default, Args)]
pub struct KafkaArgs {
    /// Kafka bootstrap servers.
    #[arg(long = "kafka", id = "kafka", env = "HERALD_KAFKA_BROKERS", global = true)]
    pub brokers: Option<String>,
    /// How to talk to the brokers (librdkafka `security.protocol`).
    #[arg(long, env = "HERALD_KAFKA_SECURITY_PROTOCOL", value_enum, global = true)]
    pub kafka_security_protocol: Option<SecurityProtocol>,
    /// SASL mechanism (`sasl.mechanism`).
    #[arg(long, env = "HERALD_KAFKA_SASL_MECHANISM", value_enum, ignore_case = true, global = true)]
    pub kafka_sasl_mechanism: Option<SaslMechanism>,
    #[arg(long, env = "HERALD_KAFKA_SASL_USERNAME", global = true)]
    pub kafka_sasl_username: Option<String>,
    #[arg(long, env = "HERALD_KAFKA_SASL_PASSWORD", hide_env_values = true, global = true)]
    pub kafka_sasl_password: Option<Secret>,
    /// CA certificate(s) that sign the brokers' certificates (PEM,
    /// `ssl.ca.location`); default: the system's trust store.
    #[arg(long, env = "HERALD_KAFKA_SSL_CA", global = true)]
    pub kafka_ssl_ca: Option<PathBuf>,
    /// Client certificate (PEM) for brokers that require mutual TLS.
    #[arg(long, env = "HERALD_KAFKA_SSL_CERTIFICATE", global = true, requires = "kafka_ssl_key")]
    pub kafka_ssl_certificate: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "HERALD_KAFKA_SSL_KEY", global = true, requires = "kafka_ssl_certificate")]
    pub kafka_ssl_key: Option<PathBuf>,
    /// Any other librdkafka property, `KEY=VALUE`, for every client Herald
    /// builds; repeatable (in the variable: separated by `;`).
    #[arg(long = "kafka-property", env = "HERALD_KAFKA_PROPERTIES", value_delimiter = ';', hide_env_values = true, global = true, value_parser = parse_property)]
    pub kafka_properties: Vec<(String, Secret)>,
}

fn parse_property(text: &str) -> Result<(String, Secret), String> {
    match split_key_value(text) {
        Some((key, value)) => Ok((key, Secret::new(value))),
        // The value may be a secret: name only the key, never echo the text.
        None => Err(format!("expected KEY=VALUE (a librdkafka property), got an entry without `=` starting {:?}", key_hint(text))),
    }
}

/// A client setting that is not a secret, `KEY=VALUE` (the relay's
/// producer tuning: `linger.ms=0`, …); a clap value parser.
pub fn parse_setting(text: &str) -> Result<(String, String), String> {
    split_key_value(text)
        .map(|(key, value)| (key, value.to_owned()))
        .ok_or_else(|| format!("expected KEY=VALUE (a librdkafka setting), got {text:?}"))
}

/// `KEY=VALUE` with a key that is not blank; the value may hold `=`.
fn split_key_value(text: &str) -> Option<(String, &str)> {
    text.split_once('=').filter(|(key, _)| !key.trim().is_empty()).map(|(key, value)| (key.trim().to_owned(), value))
}

fn key_hint(text: &str) -> String {
    text.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '_').take(40).collect()
}

impl KafkaArgs {
    /// The client configuration for `brokers`, with every security setting
    /// given; [`BadConnection`] when they contradict each other.
    pub fn config_for(&self, brokers: &str) -> Result<KafkaConfig, BadConnection> {
        let mut kafka = KafkaConfig::new(brokers);
        for (key, value) in &self.kafka_properties {
            kafka = kafka.with_secret(key.as_str(), value);
        }
        if let Some(protocol) = self.kafka_security_protocol {
            kafka = kafka.with("security.protocol", protocol.to_possible_value().map(|v| v.get_name().to_owned()).unwrap_or_default());
        }
        if let Some(mechanism) = self.kafka_sasl_mechanism {
            kafka = kafka.with("sasl.mechanism", mechanism.librdkafka());
        }
        if let Some(username) = &self.kafka_sasl_username {
            kafka = kafka.with("sasl.username", username.as_str());
        }
        if let Some(password) = &self.kafka_sasl_password {
            kafka = kafka.with_secret("sasl.password", password);
        }
        let paths = [
            ("ssl.ca.location", &self.kafka_ssl_ca),
            ("ssl.certificate.location", &self.kafka_ssl_certificate),
            ("ssl.key.location", &self.kafka_ssl_key),
        ];
        for (key, path) in paths {
            if let Some(path) = path {
                kafka = kafka.with(key, path.display().to_string());
            }
        }
        check_consistent(&kafka)?;
        Ok(kafka)
    }

    /// [`KafkaArgs::config_for`] the given brokers, checked against the
    /// cluster: `None` without `--kafka`.
    pub async fn connect(&self) -> anyhow::Result<Option<KafkaConfig>> {
        match &self.brokers {
            Some(brokers) => Ok(Some(self.connect_to(brokers).await?)),
            None => Ok(None),
        }
    }

    /// [`KafkaArgs::config_for`] `brokers`, checked against the cluster.
    pub async fn connect_to(&self, brokers: &str) -> anyhow::Result<KafkaConfig> {
        let kafka = self.config_for(brokers)?;
        check(&kafka, KAFKA_CHECK_TIMEOUT).await?;
        Ok(kafka)
    }
}

/// Refuses at start what would otherwise fail on every connection.
fn check_consistent(kafka: &KafkaConfig) -> Result<(), BadConnection> {
    let protocol = kafka.get("security.protocol").unwrap_or("plaintext").to_ascii_lowercase();
    let sasl = protocol.starts_with("sasl");
    if sasl && (kafka.get("sasl.username").is_none() || kafka.get("sasl.password").is_none()) {
        let mechanism = kafka.get("sasl.mechanism").unwrap_or("GSSAPI");
        if mechanism.starts_with("SCRAM") || mechanism == "PLAIN" {
            return Err(BadConnection(format!(
                "security protocol {protocol} with {mechanism} needs --kafka-sasl-username and --kafka-sasl-password (HERALD_KAFKA_SASL_USERNAME, HERALD_KAFKA_SASL_PASSWORD)"
            )));
        }
    }
    if !sasl && (kafka.get("sasl.mechanism").is_some() || kafka.get("sasl.username").is_some()) {
        return Err(BadConnection(format!(
            "SASL settings given but the security protocol is {protocol}: add --kafka-security-protocol sasl_ssl (or sasl_plaintext)"
        )));
    }
    Ok(())
}

/// [`herald_kafka::check_connection`]: a refusal (credentials, TLS,
/// settings) is [`BadConnection`]; a cluster that does not answer within
/// `within` is only a warning, because every role rides out a broker
/// outage and one may be starting while the cluster restarts.
pub async fn check(kafka: &KafkaConfig, within: Duration) -> Result<(), BadConnection> {
    match herald_kafka::check_connection(kafka, within).await {
        Ok(()) => Ok(()),
        Err(unreachable @ ConnectError::Unreachable { .. }) => {
            warn!(error = %unreachable, "starting without an answer from Kafka; its clients keep trying");
            Ok(())
        }
        Err(refused) => Err(BadConnection(format!("{refused} (brokers {})", kafka.brokers()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sasl(username: Option<&str>, password: Option<&str>) -> KafkaArgs {
        KafkaArgs {
            kafka_security_protocol: Some(SecurityProtocol::SaslSsl),
            kafka_sasl_mechanism: Some(SaslMechanism::ScramSha512),
            kafka_sasl_username: username.map(str::to_owned),
            kafka_sasl_password: password.map(Secret::new),
            ..KafkaArgs::default()
        }
    }

    #[test]
    fn every_security_flag_reaches_the_configuration() {
        let args = KafkaArgs { kafka_ssl_ca: Some("/ca.pem".into()), ..sasl(Some("herald"), Some("hunter2")) };
        let kafka = args.config_for("b:9093").expect("consistent");
        assert_eq!(kafka.get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(kafka.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(kafka.get("sasl.username"), Some("herald"));
        assert_eq!(kafka.get("sasl.password"), Some("hunter2"));
        assert_eq!(kafka.get("ssl.ca.location"), Some("/ca.pem"));
        assert!(!format!("{args:?} {kafka:?}").contains("hunter2"));
    }

    #[test]
    fn contradictory_settings_are_refused() {
        assert!(sasl(Some("herald"), None).config_for("b").is_err(), "SCRAM without a password");
        assert!(sasl(None, Some("p")).config_for("b").is_err(), "SCRAM without a user");
        let plaintext_with_sasl = KafkaArgs { kafka_security_protocol: Some(SecurityProtocol::Plaintext), ..sasl(Some("u"), Some("p")) };
        assert!(plaintext_with_sasl.config_for("b").is_err(), "SASL settings on a plaintext protocol");
    }

    #[test]
    fn a_setting_is_key_value() {
        assert_eq!(parse_setting(" linger.ms =0"), Ok(("linger.ms".to_owned(), "0".to_owned())));
        assert_eq!(parse_setting("client.id=a=b"), Ok(("client.id".to_owned(), "a=b".to_owned())));
        assert!(parse_setting("linger.ms").is_err() && parse_setting("=0").is_err());
    }

    #[test]
    fn a_property_is_key_value_and_a_bad_one_is_not_echoed() {
        let (key, value) = parse_property("ssl.key.password=s3cret=x").expect("parses");
        assert_eq!((key.as_str(), value.expose()), ("ssl.key.password", "s3cret=x"));
        let error = parse_property("sasl.password s3cret").expect_err("no `=`");
        assert!(!error.contains("s3cret") && error.contains("sasl.password"), "{error}");
    }
}
