//! The one place Herald builds Kafka clients.
//!
//! Every producer, group consumer, history reader and admin client starts
//! from [`KafkaConfig`]: the bootstrap list plus the connection settings an
//! operator gave (security, client id, timeouts). A setting added here is in
//! every client, so no role can connect to the cluster differently from the
//! others. Under the operator's settings lie Herald's tuning defaults
//! (prefetch, session timeout), which an operator may replace; on top of
//! them, the delivery settings are Herald's promises, fixed per kind of
//! client.

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

/// A group consumer's tuning, under the operator's settings.
const CONSUMER_DEFAULTS: [(&str, &str); 4] = [
    ("auto.commit.interval.ms", "1000"),
    // Low so a consumer that died without leaving frees its partitions soon.
    ("session.timeout.ms", "6000"),
    ("heartbeat.interval.ms", "500"),
    // Prefetch bound. librdkafka holds several times the records' bytes
    // for what it counts here (a message's bookkeeping, whole fetch
    // buffers): 16 MB cost a draining subscription ~60 MB of its ~140, 8 MB
    // half that at the same rate, 4 MB starved it on the mock cluster
    // (BENCHMARKS.md, "Memory").
    ("queued.max.messages.kbytes", "8192"),
];

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
        self.tuned(&[])
    }

    /// The connection settings over Herald's `defaults` for a kind of
    /// client: a default is a tuning choice (how far ahead to fetch, how soon
    /// a silent member is given up), so an operator's setting of the same
    /// key wins. Promises are set after this and win over both.
    fn tuned(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        for (key, value) in defaults {
            config.set(*key, *value);
        }
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
        let mut config = self.tuned(&CONSUMER_DEFAULTS);
        config
            .set("group.id", group)
            .set("enable.auto.commit", "true")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed");
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
    fn an_operators_setting_replaces_a_default_but_not_a_promise() {
        assert_eq!(KafkaConfig::new("b").consumer("g").get("queued.max.messages.kbytes"), Some("8192"));
        let kafka = KafkaConfig::new("b").with("queued.max.messages.kbytes", "4096").with("enable.auto.offset.store", "true");
        let consumer = kafka.consumer("g");
        assert_eq!(consumer.get("queued.max.messages.kbytes"), Some("4096"));
        assert_eq!(consumer.get("enable.auto.offset.store"), Some("false"));
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
