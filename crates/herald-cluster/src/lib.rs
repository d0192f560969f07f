//! Apache Kafka clusters on loopback, for the tests, the drill and the
//! benchmarks: infrastructure only, never part of a Herald role.
//!
//! Herald's users run Apache Kafka with three or more brokers, replication
//! factor 3 and `min.insync.replicas=2`; the failure modes worth testing
//! (a leader killed mid-write, a node restarting under an idempotent
//! producer, rebalances run by the real group coordinator) exist only there.
//! A [`Cluster`] is such a cluster of combined broker+controller nodes, each
//! a `java -cp '<kafka home>/*' kafka.Kafka` process that can be SIGKILLed
//! and restarted on its own storage.
//!
//! Every node listens twice for clients: PLAINTEXT ([`Cluster::bootstrap`])
//! for the tests at large, and SASL_SSL ([`Cluster::secure`]) so that
//! Herald's TLS and SASL settings meet a real broker, which is how its
//! users connect; see [`SecureListener`]. Its certificates are made at
//! start by the `openssl` CLI, which must be on the `PATH`.
//!
//! The broker's jars come from Maven Central: `scripts/kafka-fetch` copies
//! the runtime dependencies pinned in `tests/kafka/pom.xml` into
//! `~/.cache/herald/kafka-<version>/` and `scripts/test` exports that
//! directory as `HERALD_KAFKA_HOME`.

mod node;
mod props;
mod secure;
mod tls;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use base64::Engine as _;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

pub use node::Node;
use props::Ports;
pub use secure::SecureListener;

/// Where the broker's jars are: set by `scripts/test`.
pub const KAFKA_HOME_ENV: &str = "HERALD_KAFKA_HOME";
/// JVM options for every node, replacing those of its [`Jit`].
pub const JVM_OPTS_ENV: &str = "HERALD_KAFKA_JVM_OPTS";
/// Small heap and serial GC, with the JVM's full tiered compilation, as
/// brokers run in production: slower to start, less CPU per request once
/// warm.
macro_rules! steady_jvm_opts {
    () => {
        "-Xms64m -Xmx512m -XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true"
    };
}
pub const STEADY_JVM_OPTS: &str = steady_jvm_opts!();
/// The same with the C1 compiler only: three nodes plus the tests share two
/// cores, and a node spends most of its start in the JIT.
pub const DEFAULT_JVM_OPTS: &str = concat!(steady_jvm_opts!(), " -XX:TieredStopAtLevel=1");

/// How the nodes' JVMs compile Kafka's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Jit {
    /// C1 only ([`DEFAULT_JVM_OPTS`]): quick to start, for tests.
    #[default]
    QuickStart,
    /// Full tiered compilation ([`STEADY_JVM_OPTS`]): for benchmarks, whose
    /// figures should be the brokers' steady state. On the 2-core machine
    /// the relay's batches waited 9–14 ms for `acks=all` against 20–25 ms
    /// with C1 only (BENCHMARKS.md, "Latency").
    Steady,
}

impl Jit {
    /// The options a node starts with: [`JVM_OPTS_ENV`] if set, else this
    /// choice's.
    fn jvm_opts(self) -> String {
        self.jvm_opts_over(std::env::var(JVM_OPTS_ENV).ok())
    }

    fn jvm_opts_over(self, given: Option<String>) -> String {
        given.unwrap_or_else(|| {
            match self {
                Jit::QuickStart => DEFAULT_JVM_OPTS,
                Jit::Steady => STEADY_JVM_OPTS,
            }
            .to_owned()
        })
    }
}
/// How long a node may take to join (JVM start, log recovery, catching up
/// with the quorum) on a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Port clashes with another cluster starting at the same moment are
/// retried with fresh ports this many times.
const START_ATTEMPTS: usize = 3;

/// The jar directory from `HERALD_KAFKA_HOME`, checked.
pub fn kafka_home_from_env() -> anyhow::Result<PathBuf> {
    let home = std::env::var_os(KAFKA_HOME_ENV).filter(|h| !h.is_empty()).with_context(|| {
        format!("{KAFKA_HOME_ENV} is not set: run scripts/kafka-fetch (scripts/test does) and export the directory it prints")
    })?;
    let home = PathBuf::from(home);
    check_kafka_home(&home)?;
    Ok(home)
}

/// An error unless `home` holds the broker's jars.
pub fn check_kafka_home(home: &Path) -> anyhow::Result<()> {
    let has_broker = std::fs::read_dir(home)
        .with_context(|| format!("reading {}", home.display()))?
        .filter_map(Result::ok)
        .any(|e| e.file_name().to_string_lossy().starts_with("kafka_2.13-"));
    anyhow::ensure!(has_broker, "{} holds no kafka_2.13 jar: run scripts/kafka-fetch", home.display());
    Ok(())
}

/// A running cluster. Dropping it SIGKILLs every node; its directory is the
/// caller's to remove.
pub struct Cluster {
    nodes: Vec<Node>,
    /// One client for every metadata question (the drill asks every
    /// second): a librdkafka client is threads and connections, not a
    /// value to make per call. It reconnects by itself as nodes come back.
    metadata: BaseConsumer,
    secure: SecureListener,
}

impl Cluster {
    /// Formats and starts `nodes` nodes under `dir` and waits until the
    /// metadata lists all of them.
    pub fn start(kafka_home: &Path, dir: &Path, nodes: usize) -> anyhow::Result<Cluster> {
        Cluster::start_with(kafka_home, dir, nodes, Jit::QuickStart)
    }

    /// [`Cluster::start`] with the nodes' JVMs compiling as `jit` says.
    pub fn start_with(kafka_home: &Path, dir: &Path, nodes: usize, jit: Jit) -> anyhow::Result<Cluster> {
        anyhow::ensure!(nodes >= 1, "a cluster needs at least one node");
        check_kafka_home(kafka_home)?;
        // The CA paths go to clients in other directories (the binary's env
        // file), and each node resolves paths from its own directory.
        let dir = std::path::absolute(dir).with_context(|| format!("resolving {}", dir.display()))?;
        let mut last_error = None;
        for attempt in 1..=START_ATTEMPTS {
            let attempt_dir = dir.join(format!("attempt-{attempt}"));
            match Cluster::try_start(kafka_home, &attempt_dir, nodes, jit) {
                Ok(cluster) => return Ok(cluster),
                Err(e) if node::port_clash(&attempt_dir) && attempt < START_ATTEMPTS => last_error = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("the cluster did not start")))
    }

    fn try_start(kafka_home: &Path, dir: &Path, nodes: usize, jit: Jit) -> anyhow::Result<Cluster> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let ports = free_ports(nodes)?;
        let log4j = dir.join("log4j2.properties");
        std::fs::write(&log4j, props::LOG4J2)?;
        let secure = SecureListener::create(&dir.join("tls"), &ports)?;
        let cluster_id = new_cluster_id();
        let mut list = Vec::with_capacity(nodes);
        for id in 1..=nodes {
            let node_dir = dir.join(format!("node-{id}"));
            std::fs::create_dir_all(&node_dir)?;
            let properties = node_dir.join("server.properties");
            std::fs::write(&properties, props::render(id, &ports, &node_dir.join("data"), &secure))?;
            list.push(Node::new(id, ports[id - 1].broker, node_dir, kafka_home, &log4j, jit.jvm_opts()));
        }
        node::format_storage(&list, &cluster_id, &secure.scram_credential())?;
        let metadata = metadata_client(&bootstrap(&list))?;
        let mut cluster = Cluster { nodes: list, metadata, secure };
        for node in &mut cluster.nodes {
            node.spawn()?;
        }
        cluster.wait_for_brokers(nodes)?;
        Ok(cluster)
    }

    /// Bootstrap servers: every node, so a client can start with any of
    /// them down.
    pub fn bootstrap(&self) -> String {
        bootstrap(&self.nodes)
    }

    /// The SASL_SSL listener: its bootstrap servers, CA and credentials.
    pub fn secure(&self) -> &SecureListener {
        &self.secure
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Node with Kafka id `id` (1-based).
    pub fn node(&mut self, id: i32) -> anyhow::Result<&mut Node> {
        self.nodes.iter_mut().find(|n| n.id() as i32 == id).with_context(|| format!("no node {id}"))
    }

    /// SIGKILLs node `id`: no controlled shutdown, no flush.
    pub fn kill(&mut self, id: i32) -> anyhow::Result<()> {
        self.node(id)?.kill()
    }

    /// Starts node `id` again on its storage and waits until the metadata
    /// lists every node.
    pub fn restart(&mut self, id: i32) -> anyhow::Result<()> {
        self.node(id)?.spawn()?;
        self.wait_for_brokers(self.nodes.len())
    }

    /// SIGKILLs every node.
    pub fn kill_all(&mut self) -> anyhow::Result<()> {
        for node in &mut self.nodes {
            node.kill()?;
        }
        Ok(())
    }

    /// Starts every node that is down and waits for all of them.
    pub fn start_all(&mut self) -> anyhow::Result<()> {
        for node in &mut self.nodes {
            if !node.is_running() {
                node.spawn()?;
            }
        }
        self.wait_for_brokers(self.nodes.len())
    }

    /// Starts node `id` again on its storage without waiting for it; see
    /// [`Cluster::health`] to learn when it has caught up.
    pub fn start_node(&mut self, id: i32) -> anyhow::Result<()> {
        self.node(id)?.spawn()
    }

    /// One look at the metadata: brokers listed, partitions whose in-sync
    /// replicas are fewer than their replicas, partitions without a leader.
    pub fn health(&self, timeout: Duration) -> anyhow::Result<Health> {
        let metadata = self.metadata.fetch_metadata(None, timeout)?;
        let partitions = || metadata.topics().iter().flat_map(|t| t.partitions());
        Ok(Health {
            brokers: metadata.brokers().len(),
            under_replicated: partitions().filter(|p| p.isr().len() < p.replicas().len()).count(),
            leaderless: partitions().filter(|p| p.leader() < 0).count(),
        })
    }

    /// Kafka id of the leader of `topic`/`partition`, as the metadata says.
    pub fn leader_of(&self, topic: &str, partition: i32) -> anyhow::Result<i32> {
        let metadata = self.metadata.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let leader = metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions())
            .find(|p| p.id() == partition)
            .map(|p| p.leader())
            .with_context(|| format!("no metadata for {topic}/{partition}"))?;
        anyhow::ensure!(leader >= 1, "{topic}/{partition} has no leader right now");
        Ok(leader)
    }

    /// Waits until the metadata lists `expected` brokers.
    pub fn wait_for_brokers(&mut self, expected: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            for node in &mut self.nodes {
                node.check_alive()?;
            }
            let seen = self.metadata.fetch_metadata(None, Duration::from_secs(5)).map(|m| m.brokers().len()).unwrap_or(0);
            if seen >= expected {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the metadata lists {seen} of {expected} brokers after {READY_TIMEOUT:?}; see {}",
                self.nodes[0].log_path().display()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.kill();
        }
    }
}

/// A cluster id as Kafka makes them: a random UUID in URL-safe base64,
/// drawn again when it starts with `-`, which the storage tool's argument
/// parser would take for an option (one id in 64).
fn new_cluster_id() -> String {
    loop {
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(uuid::Uuid::new_v4().as_bytes());
        if !id.starts_with('-') {
            return id;
        }
    }
}

fn bootstrap(nodes: &[Node]) -> String {
    nodes.iter().map(Node::address).collect::<Vec<_>>().join(",")
}

fn metadata_client(bootstrap: &str) -> anyhow::Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("log_level", "3")
        // Nodes come and go on purpose: reconnect within a second of one
        // coming back, not after librdkafka's default 10 s backoff.
        .set("reconnect.backoff.max.ms", "1000")
        .create()
        .context("creating a metadata client")
}

/// What [`Cluster::health`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    pub brokers: usize,
    pub under_replicated: usize,
    pub leaderless: usize,
}

/// Three loopback ports per node that were free a moment ago. Another
/// process can take one before the node binds it; [`Cluster::start`] then
/// tries again with fresh ports.
fn free_ports(nodes: usize) -> anyhow::Result<Vec<Ports>> {
    let mut held = Vec::with_capacity(nodes * 3);
    for _ in 0..nodes * 3 {
        held.push(std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?);
    }
    let port = |i: usize| held[i].local_addr().map(|a| a.port());
    (0..nodes).map(|n| Ok(Ports { broker: port(3 * n)?, controller: port(3 * n + 1)?, secure: port(3 * n + 2)? })).collect()
}

#[cfg(test)]
mod tests {
    /// One plain base64 id in 64 starts with `-`; in 2,000 draws at least
    /// one would (but for 1 in 10^13), and the storage tool refused it.
    #[test]
    fn cluster_ids_never_look_like_an_option() {
        for _ in 0..2000 {
            let id = super::new_cluster_id();
            assert!(!id.starts_with('-') && id.len() == 22, "{id}");
        }
    }

    #[test]
    fn only_tests_stop_the_jit_at_c1_and_the_operators_options_win() {
        use super::Jit;
        assert!(Jit::QuickStart.jvm_opts_over(None).contains("-XX:TieredStopAtLevel=1"));
        let steady = Jit::Steady.jvm_opts_over(None);
        assert!(!steady.contains("TieredStopAtLevel"), "{steady}");
        assert!(steady.contains("-Xmx512m") && steady.contains("-XX:+UseSerialGC"), "the same heap and collector: {steady}");
        assert_eq!(Jit::Steady.jvm_opts_over(Some("-Xmx1g".into())), "-Xmx1g");
    }
}
