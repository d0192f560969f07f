//! Kafka plumbing every role shares: the one client builder
//! ([`KafkaConfig`]) whose settings carry Herald's delivery promises, topic
//! creation, and the embedded broker.
//!
//! Settings live here, not in each role, because they *are* the promises:
//! producers are idempotent with `acks=all` (a record is acknowledged only
//! once every in-sync replica has it, and retries cannot duplicate or reorder
//! it within a partition); consumers never auto-commit (an offset is committed
//! only after the effect of the record committed in the database).

mod config;
mod connect;
mod embedded;
pub mod offsets;
mod ping;
mod topics;

pub use config::KafkaConfig;
pub use connect::{ConnectError, check_connection};
pub use embedded::EmbeddedKafka;
pub use ping::BrokerPing;
pub use topics::{Replication, TopicError, TopicSettings, ensure_topics};

/// Topic of commands for export workers.
pub const TOPIC_COMMANDS: &str = "export.commands";
/// Topic of facts about exports; every downstream subscription reads it.
pub const TOPIC_EVENTS: &str = "export.events";

/// The topics one Herald deployment uses. A prefix lets several deployments
/// (or tests) share one cluster without reading each other's records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    pub commands: String,
    pub events: String,
}

impl Default for Topics {
    fn default() -> Self {
        Topics { commands: TOPIC_COMMANDS.to_owned(), events: TOPIC_EVENTS.to_owned() }
    }
}

impl Topics {
    /// `<prefix>.export.commands` and `<prefix>.export.events`.
    pub fn with_prefix(prefix: &str) -> Topics {
        Topics { commands: format!("{prefix}.{TOPIC_COMMANDS}"), events: format!("{prefix}.{TOPIC_EVENTS}") }
    }

    pub fn all(&self) -> [&str; 2] {
        [&self.commands, &self.events]
    }
}
