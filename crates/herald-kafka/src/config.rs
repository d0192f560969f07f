//! The one place Herald builds Kafka clients.
//!
//! Every producer, group consumer, history reader and admin client starts
//! from [`KafkaConfig`]: the bootstrap list plus the connection settings an
//! operator gave (security, client id, timeouts). A setting added here is in
//! every client, so no role can connect to the cluster differently from the
//! others. The delivery settings on top of it are Herald's promises, fixed
//! per kind of client.

use std::fmt;

use herald_secret::{Secret, is_sensitive_key};
use rdkafka::ClientConfig;

/// How to reach the cluster; cheap to clone, handed to every role. Its
/// `Debug` shows secret settings (`sasl.password`, …) as `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaConfig {
    brokers: String,
    connection: Vec<(String, Setting)>,
}

/// A connection setting's value, held as a [`Secret`] when its key says it
/// is one, so no `Debug` or log line of a configuration can show it.
#[derive(Clone, PartialEq, Eq)]
enum Setting {
    Plain(String),
    Secret(Secret),
}

impl Setting {
    fn new(key: &str, value: String) -> Setting {
        if is_sensitive_key(key) { Setting::Secret(Secret::new(value)) } else { Setting::Plain(value) }
    }

    fn expose(&self) -> &str {
        match self {
            Setting::Plain(value) => value,
            Setting::Secret(secret) => secret.expose(),
        }
    }
}

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("KafkaConfig");
        out.field("brokers", &self.brokers);
        for (key, value) in &self.connection {
            match value {
                Setting::Plain(value) => out.field(key, value),
                Setting::Secret(secret) => out.field(key, secret),
            };
        }
        out.finish()
    }
}

impl KafkaConfig {
    pub fn new(brokers: impl Into<String>) -> KafkaConfig {
        KafkaConfig { brokers: brokers.into(), connection: Vec::new() }
    }

    /// A librdkafka property every client gets (e.g. `security.protocol`).
    /// A later value for the same key replaces an earlier one.
    pub fn with(self, key: impl Into<String>, value: impl Into<String>) -> KafkaConfig {
        let key = key.into();
        let value = Setting::new(&key, value.into());
        self.set(key, value)
    }

    /// [`KafkaConfig::with`] for a value that arrives as a [`Secret`].
    pub fn with_secret(self, key: impl Into<String>, value: &Secret) -> KafkaConfig {
        self.set(key.into(), Setting::Secret(value.clone()))
    }

    fn set(mut self, key: String, value: Setting) -> KafkaConfig {
        self.connection.retain(|(k, _)| *k != key);
        self.connection.push((key, value));
        self
    }

    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// The value of a connection property given with [`KafkaConfig::with`].
    pub fn get(&self, key: &str) -> Option<&str> {
        self.connection.iter().find(|(k, _)| k == key).map(|(_, value)| value.expose())
    }

    fn base(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        for (key, value) in &self.connection {
            config.set(key, value.expose());
        }
        config
    }

    /// A producer whose acknowledgements mean the broker has the record for
    /// good: idempotent, `acks=all`.
    pub fn producer(&self) -> ClientConfig {
        let mut config = self.base();
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            // Bounded so an unreachable broker surfaces as a failed delivery
            // the caller can record and retry, instead of a future that never
            // resolves. The relay, which must not leave gaps, turns it off.
            .set("message.timeout.ms", "30000")
            .set("linger.ms", "5")
            .set("compression.type", "lz4");
        config
    }

    /// A consumer in `group` whose committed offsets never pass a record the
    /// application has not finished: librdkafka commits in the background
    /// only offsets the application *stored*, and Herald stores an offset
    /// only after the record's effect committed in the database.
    pub fn consumer(&self, group: &str) -> ClientConfig {
        let mut config = self.base();
        config
            .set("group.id", group)
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "1000")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            // Low so a consumer that died without leaving frees its partitions soon.
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500")
            .set("isolation.level", "read_committed")
            // Prefetch bound: librdkafka's default (64 MB) is most of a
            // subscription's memory while it drains a backlog; 16 MB is
            // still dozens of batches ahead of the database (BENCHMARKS.md,
            // "Memory").
            .set("queued.max.messages.kbytes", "16384");
        config
    }

    /// A client that acts on `group`'s offsets without joining it (reading
    /// or committing them on purpose) and never commits on its own.
    pub fn group_admin(&self, group: &str) -> ClientConfig {
        let mut config = self.base();
        config.set("group.id", group).set("enable.auto.commit", "false");
        config
    }

    /// A consumer outside any group that reads partitions it assigns itself
    /// (replay, audit) or only asks for metadata and watermarks. Offsets are
    /// never committed: such a reader has no place it must resume from.
    pub fn reader(&self) -> ClientConfig {
        let mut config = self.base();
        config
            .set("group.id", "herald.reader")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("isolation.level", "read_committed");
        config
    }

    /// An admin client (topic creation, configs).
    pub fn admin(&self) -> ClientConfig {
        self.base()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(kafka: &KafkaConfig) -> [ClientConfig; 5] {
        [kafka.producer(), kafka.consumer("g"), kafka.group_admin("g"), kafka.reader(), kafka.admin()]
    }

    #[test]
    fn every_client_carries_the_connection_settings() {
        let kafka = KafkaConfig::new("b1:9092,b2:9092").with("security.protocol", "SSL").with("client.id", "herald");
        for config in kinds(&kafka) {
            assert_eq!(config.get("bootstrap.servers"), Some("b1:9092,b2:9092"));
            assert_eq!(config.get("security.protocol"), Some("SSL"));
            assert_eq!(config.get("client.id"), Some("herald"));
        }
    }

    #[test]
    fn a_later_connection_setting_replaces_an_earlier_one() {
        let kafka = KafkaConfig::new("b").with("client.id", "a").with("client.id", "b");
        assert_eq!(kafka.get("client.id"), Some("b"));
        assert_eq!(kafka.connection.len(), 1);
    }

    #[test]
    fn secret_settings_reach_the_client_but_not_debug() {
        let kafka = KafkaConfig::new("b")
            .with("sasl.username", "herald")
            .with("sasl.password", "hunter2")
            .with_secret("ssl.key.password", &Secret::new("p4ss"));
        let shown = format!("{kafka:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("p4ss"), "{shown}");
        assert!(shown.contains("herald"), "{shown}");
        for config in kinds(&kafka) {
            assert_eq!(config.get("sasl.password"), Some("hunter2"));
            assert_eq!(config.get("ssl.key.password"), Some("p4ss"));
        }
    }

    #[test]
    fn delivery_promises_hold() {
        let kafka = KafkaConfig::new("b");
        let producer = kafka.producer();
        assert_eq!(producer.get("enable.idempotence"), Some("true"));
        assert_eq!(producer.get("acks"), Some("all"));
        let consumer = kafka.consumer("g");
        assert_eq!(consumer.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(kafka.reader().get("enable.auto.commit"), Some("false"));
        assert_eq!(kafka.group_admin("g").get("enable.auto.commit"), Some("false"));
    }
}
