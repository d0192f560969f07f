//! Where Herald runs: flags and `HERALD_*` variables, or the embedded default
//! (SQLite in a temporary directory + the in-process Kafka mock cluster) when
//! neither names a database or a broker.

use std::path::Path;

use clap::Args;
use herald_api::Tokens;
use herald_envelope::{Registry, Sources};
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_notify::intents::NotifyHandler;
use herald_notify::templates::NotifyRules;
use herald_secret::{Secret, SecretUrl};
use tempfile::TempDir;
use tracing::info;

use crate::connection::{BadConnection, DatabaseArgs, KafkaArgs, Schema, open_database};
use crate::pipeline::Wiring;

/// Where a role runs. Without `--database` it is embedded SQLite, without
/// `--kafka` the in-process cluster.
#[derive(Debug, Clone, Args)]
pub struct Backends {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub topic: crate::topic_args::TopicArgs,
    /// Where export artifacts go: a directory, or s3://bucket/prefix (configured
    /// by the AWS_* variables); default: a temporary directory.
    #[arg(long, env = "HERALD_ARTIFACTS")]
    pub artifacts: Option<String>,
    /// Prefix of Herald's topic names (`<prefix>.export.commands`), to share a cluster.
    #[arg(long, env = "HERALD_TOPIC_PREFIX")]
    pub topic_prefix: Option<String>,
    /// Prefix of consumer group ids (`<prefix>.<subscription>`).
    #[arg(long, env = "HERALD_GROUP_PREFIX", default_value = "herald")]
    pub group_prefix: String,
    #[command(flatten)]
    pub sources: SourceArgs,
    /// API tokens as token:caller,token:caller; default: one printed at start.
    #[arg(long, env = "HERALD_API_TOKENS", hide_env_values = true)]
    pub tokens: Option<Secret>,
}

/// Which sources the subscriptions take records from; the same flag for
/// the roles that apply records and for `herald dlq`, which applies them
/// again, so a redrive trusts exactly what the subscription trusted.
#[derive(Debug, Clone, Default, Args)]
pub struct SourceArgs {
    /// Sources whose records the subscriptions apply: exact, or a prefix
    /// ending in `*` (repeatable; comma-separated in the variable). A record
    /// from any other is dead-lettered as `untrusted source`. Default:
    /// Herald's own, `/herald/exports`.
    #[arg(long = "accept-source", env = "HERALD_ACCEPT_SOURCES", value_delimiter = ',', global = true)]
    pub accept_sources: Vec<String>,
    /// A directory of `<subject>.v<N>.avsc` schemas deployed after the build
    /// (and its own `compatibility.toml`, optional), read beside the
    /// compiled-in ones: a new event type or version needs no rebuild. The
    /// union must pass the compatibility check, or the command stops (exit 2).
    #[arg(long = "schemas", env = "HERALD_SCHEMAS", global = true)]
    pub schemas: Option<std::path::PathBuf>,
    /// Which events create notification intents, for whom, with which body
    /// (a TOML file of `[[notify]]` rules, templates over the event; see
    /// README). Default: a completed export tells its caller.
    #[arg(long = "notify-rules", env = "HERALD_NOTIFY_RULES", global = true)]
    pub notify_rules: Option<std::path::PathBuf>,
}

impl SourceArgs {
    /// The embedded schemas plus `--schemas`, accepting the sources
    /// `--accept-source` names.
    pub fn registry(&self) -> Result<Registry, BadConnection> {
        let mut registry = Registry::embedded();
        if let Some(dir) = &self.schemas {
            registry = registry.with_dir(dir).map_err(|e| BadConnection(format!("--schemas: {e}")))?;
        }
        if self.accept_sources.is_empty() {
            return Ok(registry);
        }
        let sources = Sources::new(self.accept_sources.iter().cloned()).map_err(|e| BadConnection(format!("--accept-source: {e}")))?;
        Ok(registry.accepting(sources))
    }
}

impl SourceArgs {
    /// The notify subscription's handler: `--notify-rules`, else Herald's own.
    pub fn notify_handler(&self) -> Result<NotifyHandler, BadConnection> {
        let Some(path) = &self.notify_rules else { return Ok(NotifyHandler::default()) };
        let text = std::fs::read_to_string(path).map_err(|e| BadConnection(format!("--notify-rules {}: {e}", path.display())))?;
        let rules = NotifyRules::parse(&text).map_err(|e| BadConnection(format!("--notify-rules {}: {e}", path.display())))?;
        Ok(NotifyHandler::new(rules))
    }
}

impl Backends {
    /// The embedded schemas, accepting the sources `--accept-source` names.
    pub fn registry(&self) -> Result<Registry, BadConnection> {
        self.sources.registry()
    }

    /// See [`SourceArgs::notify_handler`].
    pub fn notify_handler(&self) -> Result<NotifyHandler, BadConnection> {
        self.sources.notify_handler()
    }
}

/// Resolved backends plus whatever must stay alive for them.
pub struct Environment {
    pub wiring: Wiring,
    /// A token for the default caller when none were configured.
    pub default_token: Option<String>,
    _embedded_kafka: Option<EmbeddedKafka>,
    data_dir: Option<TempDir>,
}

impl Environment {
    /// The temporary directory of this run (the embedded database, artifacts,
    /// anything else that should go when the process does).
    pub fn data_dir(&self) -> Option<&Path> {
        self.data_dir.as_ref().map(TempDir::path)
    }
}

impl Backends {
    /// Herald's topic names under `--topic-prefix`.
    pub fn topics(&self) -> Topics {
        self.topic_prefix.as_deref().map_or_else(Topics::default, Topics::with_prefix)
    }

    pub async fn resolve(&self) -> anyhow::Result<Environment> {
        let data_dir = tempfile::Builder::new().prefix("herald-").tempdir()?;
        // The embedded default is this process's alone: it migrates itself.
        let (database, schema) = match &self.database.url {
            Some(url) => (url.clone(), Schema::Check),
            None => (SecretUrl::new(format!("sqlite://{}?mode=rwc", data_dir.path().join("herald.sqlite").display())), Schema::Migrate),
        };
        let db = open_database(&database, schema).await?;
        let topics = self.topics();
        let (kafka, embedded) = match self.kafka.connect().await? {
            Some(kafka) => {
                herald_kafka::ensure_topics(&kafka, &topics.all(), self.topic.settings()).await?;
                (kafka, None)
            }
            None => {
                let embedded = EmbeddedKafka::start(1, &topics.all(), self.topic.partitions)?;
                (KafkaConfig::new(embedded.bootstrap_servers()), Some(embedded))
            }
        };
        let (tokens, default_token) = match &self.tokens {
            Some(spec) => (Tokens::parse(spec.expose()).map_err(|e| BadConnection(format!("--tokens (HERALD_API_TOKENS): {e}")))?, None),
            None => {
                let token = format!("herald-{}", uuid::Uuid::new_v4().simple());
                (Tokens::single(&token, "demo"), Some(token))
            }
        };
        let artifacts = self.artifacts.clone().unwrap_or_else(|| data_dir.path().join("artifacts").display().to_string());
        info!(%database, brokers = %kafka.brokers(), %artifacts, "backends ready");
        Ok(Environment {
            wiring: Wiring { db, kafka, topics, group_prefix: self.group_prefix.clone(), artifacts, tokens },
            default_token,
            _embedded_kafka: embedded,
            data_dir: Some(data_dir),
        })
    }
}
