//! How the topics Herald creates are laid out: one set of flags for every
//! role that may create them.

use clap::Args;
use herald_kafka::TopicSettings;

#[derive(Debug, Clone, Args)]
pub struct TopicArgs {
    /// Partitions of topics Herald creates when they are missing.
    #[arg(long, env = "HERALD_KAFKA_PARTITIONS", default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..))]
    pub partitions: i32,
    /// Replication factor of topics Herald creates; default 3 on a cluster
    /// of three or more brokers, else 1 (with a warning).
    #[arg(long, env = "HERALD_KAFKA_REPLICATION_FACTOR", value_parser = clap::value_parser!(i32).range(1..))]
    pub replication_factor: Option<i32>,
    /// `min.insync.replicas` of topics Herald creates; default 2 with three
    /// replicas, else 1. An `acks=all` write is acknowledged once this many
    /// replicas have it.
    #[arg(long, env = "HERALD_KAFKA_MIN_INSYNC_REPLICAS", value_parser = clap::value_parser!(i32).range(1..))]
    pub min_insync_replicas: Option<i32>,
}

impl TopicArgs {
    pub fn settings(&self) -> TopicSettings {
        TopicSettings {
            partitions: self.partitions,
            replication_factor: self.replication_factor,
            min_insync_replicas: self.min_insync_replicas,
        }
    }
}
