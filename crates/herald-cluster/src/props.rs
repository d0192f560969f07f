//! The properties of one node. Every node is a combined broker and
//! controller, so a three-node cluster is also a quorum of three.

use std::fmt::Write as _;
use std::path::Path;

use crate::SecureListener;

/// Loopback ports of one node.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub broker: u16,
    pub controller: u16,
    /// The SASL_SSL listener (see [`SecureListener`]).
    pub secure: u16,
}

/// `server.properties` for node `id` (1-based) of a cluster whose nodes
/// listen on `ports` (index = id - 1).
///
/// Durability as users run it: replication factor 3 and
/// `min.insync.replicas=2` as the defaults for every topic, internal ones
/// included (capped by the node count, since a smaller cluster could not
/// create them). Sized for a 2-core machine: few threads and few
/// internal-topic partitions, and no initial rebalance delay so a group's
/// first member starts at once.
pub fn render(id: usize, ports: &[Ports], data_dir: &Path, secure: &SecureListener) -> String {
    let nodes = ports.len();
    let replication = nodes.min(3);
    let min_isr = if replication >= 3 { 2 } else { 1 };
    let voters: Vec<String> = ports.iter().enumerate().map(|(i, p)| format!("{}@127.0.0.1:{}", i + 1, p.controller)).collect();
    let own = ports[id - 1];
    let mut out = String::new();
    let mut set = |key: &str, value: &dyn std::fmt::Display| {
        let _ = writeln!(out, "{key}={value}");
    };
    set("process.roles", &"broker,controller");
    set("node.id", &id);
    set("controller.quorum.voters", &voters.join(","));
    set(
        "listeners",
        &format!("PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{},SASL_SSL://127.0.0.1:{}", own.broker, own.controller, own.secure),
    );
    set("advertised.listeners", &format!("PLAINTEXT://127.0.0.1:{},SASL_SSL://127.0.0.1:{}", own.broker, own.secure));
    set("controller.listener.names", &"CONTROLLER");
    set("inter.broker.listener.name", &"PLAINTEXT");
    set("listener.security.protocol.map", &"PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL");
    set("sasl.enabled.mechanisms", &"SCRAM-SHA-512,PLAIN");
    // SCRAM checks against the credentials formatted into the metadata log;
    // PLAIN has no such store, so its one user is in the JAAS line.
    set("listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config", &"org.apache.kafka.common.security.scram.ScramLoginModule required;");
    set(
        "listener.name.sasl_ssl.plain.sasl.jaas.config",
        &format!("org.apache.kafka.common.security.plain.PlainLoginModule required user_{}=\"{}\";", secure.username(), secure.password()),
    );
    // Inline PEM: see `SecureListener::server_key_pem` for why not a file.
    set("listener.name.sasl_ssl.ssl.keystore.type", &"PEM");
    set("listener.name.sasl_ssl.ssl.keystore.certificate.chain", &inline_pem(&secure.server_cert_pem));
    set("listener.name.sasl_ssl.ssl.keystore.key", &inline_pem(&secure.server_key_pem));
    set("log.dirs", &data_dir.display());
    set("auto.create.topics.enable", &false);
    set("num.partitions", &1);
    set("default.replication.factor", &replication);
    set("min.insync.replicas", &min_isr);
    set("offsets.topic.replication.factor", &replication);
    set("offsets.topic.num.partitions", &4);
    set("transaction.state.log.replication.factor", &replication);
    set("transaction.state.log.min.isr", &min_isr);
    set("transaction.state.log.num.partitions", &2);
    set("share.coordinator.state.topic.replication.factor", &replication);
    set("share.coordinator.state.topic.min.isr", &min_isr);
    set("share.coordinator.state.topic.num.partitions", &1);
    set("group.initial.rebalance.delay.ms", &0);
    // A killed node's replicas drop out of the ISR after this long; the
    // default (30 s) would stall acks=all writes for half a minute per kill.
    set("replica.lag.time.max.ms", &10_000);
    set("num.network.threads", &2);
    set("num.io.threads", &2);
    set("background.threads", &2);
    set("log.cleaner.threads", &1);
    set("num.recovery.threads.per.data.dir", &1);
    // Tests shrink retention on their own topics; the cleaner must act on
    // it within a test's patience, not after the default five minutes.
    set("log.retention.check.interval.ms", &1_000);
    set("log.segment.delete.delay.ms", &0);
    out
}

/// PEM text as one properties value: `java.util.Properties` turns `\n`
/// back into the line breaks Kafka's PEM parser needs.
fn inline_pem(pem: &str) -> String {
    pem.trim().lines().map(str::trim_end).collect::<Vec<_>>().join("\\n")
}

/// Log4j 2 settings for every node: warnings and errors to `server.log` in
/// the node's directory (`kafka.logs.dir`).
pub const LOG4J2: &str = "\
rootLogger.level=WARN
rootLogger.appenderRef.file.ref=file
appender.file.type=File
appender.file.name=file
appender.file.fileName=${sys:kafka.logs.dir}/server.log
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=[%d] %p %m (%c)%n
logger.state.name=state.change.logger
logger.state.level=WARN
";

#[cfg(test)]
mod tests {
    use super::*;

    fn ports(n: u16) -> Vec<Ports> {
        (0..n).map(|i| Ports { broker: 9000 + i, controller: 9100 + i, secure: 9200 + i }).collect()
    }

    fn render(id: usize, ports: &[Ports]) -> String {
        super::render(id, ports, Path::new("/d"), &SecureListener::example(ports))
    }

    fn value<'a>(props: &'a str, key: &str) -> Option<&'a str> {
        props.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
    }

    #[test]
    fn three_nodes_replicate_three_ways_with_two_in_sync() {
        let props = render(2, &ports(3));
        assert_eq!(value(&props, "node.id"), Some("2"));
        assert_eq!(value(&props, "controller.quorum.voters"), Some("1@127.0.0.1:9100,2@127.0.0.1:9101,3@127.0.0.1:9102"));
        assert_eq!(value(&props, "listeners"), Some("PLAINTEXT://127.0.0.1:9001,CONTROLLER://127.0.0.1:9101,SASL_SSL://127.0.0.1:9201"));
        assert_eq!(value(&props, "default.replication.factor"), Some("3"));
        assert_eq!(value(&props, "min.insync.replicas"), Some("2"));
        assert_eq!(value(&props, "offsets.topic.replication.factor"), Some("3"));
    }

    #[test]
    fn a_single_node_cannot_ask_for_replicas_it_does_not_have() {
        let props = render(1, &ports(1));
        assert_eq!(value(&props, "default.replication.factor"), Some("1"));
        assert_eq!(value(&props, "min.insync.replicas"), Some("1"));
        assert_eq!(value(&props, "transaction.state.log.min.isr"), Some("1"));
    }

    /// Clients only learn of brokers that advertise the listener they came
    /// in through, so each node advertises its own SASL_SSL port.
    #[test]
    fn every_node_advertises_its_sasl_ssl_listener() {
        let ports = ports(3);
        for id in 1..=3 {
            let props = render(id, &ports);
            let advertised = format!("PLAINTEXT://127.0.0.1:{},SASL_SSL://127.0.0.1:{}", 9000 + id - 1, 9200 + id - 1);
            assert_eq!(value(&props, "advertised.listeners"), Some(advertised.as_str()));
            assert_eq!(value(&props, "inter.broker.listener.name"), Some("PLAINTEXT"));
        }
    }

    /// A PEM value spans one properties line, its line breaks escaped, or
    /// Kafka would read only the `BEGIN` line.
    #[test]
    fn the_server_key_and_certificate_are_inline_on_one_line() {
        let props = render(1, &ports(1));
        let key = value(&props, "listener.name.sasl_ssl.ssl.keystore.key").expect("key");
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----\\n") && key.ends_with("\\n-----END PRIVATE KEY-----"), "{key}");
        let chain = value(&props, "listener.name.sasl_ssl.ssl.keystore.certificate.chain").expect("chain");
        assert!(chain.starts_with("-----BEGIN CERTIFICATE-----\\n") && chain.ends_with("-----END CERTIFICATE-----"), "{chain}");
        assert!(!chain.contains('\r'), "{chain}");
        let plain = value(&props, "listener.name.sasl_ssl.plain.sasl.jaas.config").expect("PLAIN JAAS");
        assert!(plain.ends_with("required user_herald=\"example-password\";"), "{plain}");
    }
}
