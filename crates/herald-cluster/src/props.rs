//! The properties of one node. Every node is a combined broker and
//! controller, so a three-node cluster is also a quorum of three.

use std::fmt::Write as _;
use std::path::Path;

/// Loopback ports of one node.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub broker: u16,
    pub controller: u16,
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
pub fn render(id: usize, ports: &[Ports], data_dir: &Path) -> String {
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
    set("listeners", &format!("PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}", own.broker, own.controller));
    set("advertised.listeners", &format!("PLAINTEXT://127.0.0.1:{}", own.broker));
    set("controller.listener.names", &"CONTROLLER");
    set("inter.broker.listener.name", &"PLAINTEXT");
    set("listener.security.protocol.map", &"PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT");
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
        (0..n).map(|i| Ports { broker: 9000 + i, controller: 9100 + i }).collect()
    }

    fn value<'a>(props: &'a str, key: &str) -> Option<&'a str> {
        props.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
    }

    #[test]
    fn three_nodes_replicate_three_ways_with_two_in_sync() {
        let props = render(2, &ports(3), Path::new("/d"));
        assert_eq!(value(&props, "node.id"), Some("2"));
        assert_eq!(value(&props, "controller.quorum.voters"), Some("1@127.0.0.1:9100,2@127.0.0.1:9101,3@127.0.0.1:9102"));
        assert_eq!(value(&props, "listeners"), Some("PLAINTEXT://127.0.0.1:9001,CONTROLLER://127.0.0.1:9101"));
        assert_eq!(value(&props, "default.replication.factor"), Some("3"));
        assert_eq!(value(&props, "min.insync.replicas"), Some("2"));
        assert_eq!(value(&props, "offsets.topic.replication.factor"), Some("3"));
    }

    #[test]
    fn a_single_node_cannot_ask_for_replicas_it_does_not_have() {
        let props = render(1, &ports(1), Path::new("/d"));
        assert_eq!(value(&props, "default.replication.factor"), Some("1"));
        assert_eq!(value(&props, "min.insync.replicas"), Some("1"));
        assert_eq!(value(&props, "transaction.state.log.min.isr"), Some("1"));
    }
}
