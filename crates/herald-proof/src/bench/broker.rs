//! Where a benchmark publishes: librdkafka's in-process mock cluster by
//! default (so the broker is not the bottleneck), or the cluster given with
//! `--kafka` — the figures users compare with — on topics of the run's own,
//! created with Herald's durability defaults (3 replicas and
//! `min.insync.replicas` 2 on three brokers).

use herald_kafka::{EmbeddedKafka, KafkaConfig, TopicSettings};
use herald_wiring::connection::KafkaArgs;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

pub(crate) struct BenchBroker {
    pub kafka: KafkaConfig,
    pub bootstrap: String,
    cluster: Cluster,
}

/// What a run leaves behind depends on where it published.
enum Cluster {
    /// Kept alive for the run; it goes with the value.
    Mock { _cluster: EmbeddedKafka },
    /// The run's topics on a real cluster, deleted by [`BenchBroker::finish`].
    Real { topics: Vec<String> },
}

impl BenchBroker {
    /// Creates `topics` (names unique to the run on a real cluster).
    pub async fn start(args: &KafkaArgs, topics: &[&str], partitions: i32) -> anyhow::Result<BenchBroker> {
        if let (Some(kafka), Some(brokers)) = (args.connect().await?, &args.brokers) {
            herald_kafka::ensure_topics(&kafka, topics, TopicSettings::partitions(partitions)).await?;
            let topics = topics.iter().map(|t| (*t).to_owned()).collect();
            return Ok(BenchBroker { kafka, bootstrap: brokers.clone(), cluster: Cluster::Real { topics } });
        }
        let mock = EmbeddedKafka::start(1, topics, partitions)?;
        let bootstrap = mock.bootstrap_servers().to_owned();
        Ok(BenchBroker { kafka: KafkaConfig::new(&bootstrap), bootstrap, cluster: Cluster::Mock { _cluster: mock } })
    }

    /// Deletes the run's topics from a real cluster ([`delete_topics`]); the
    /// mock cluster goes with the value. Runs that fail leave theirs.
    pub async fn finish(self) -> anyhow::Result<()> {
        match &self.cluster {
            Cluster::Mock { .. } => Ok(()),
            Cluster::Real { topics } => delete_topics(&self.kafka, &topics.iter().map(String::as_str).collect::<Vec<_>>()).await,
        }
    }

    /// For the table and the JSON: `mock` or the bootstrap list.
    pub fn describe(&self) -> String {
        match self.cluster {
            Cluster::Mock { .. } => "in-process mock cluster".to_owned(),
            Cluster::Real { .. } => self.bootstrap.clone(),
        }
    }
}

/// A real cluster for the benchmarks that measure one: the one `--kafka`
/// names, or three private Apache Kafka nodes started from
/// `HERALD_KAFKA_HOME` for the run.
pub(crate) struct RealCluster {
    pub kafka: KafkaConfig,
    pub bootstrap: String,
    /// For the table and the JSON.
    pub describe: String,
    /// Keep the private nodes (and their directory) for the run.
    _nodes: Option<(herald_cluster::Cluster, tempfile::TempDir)>,
}

impl RealCluster {
    /// Whether the benchmark started these nodes itself (they have just
    /// come up), rather than being given a running cluster.
    pub fn started_here(&self) -> bool {
        self._nodes.is_some()
    }

    /// `Err(exit code 2)` with a message when neither a cluster is given
    /// nor the broker's jars are there to start one.
    pub async fn given_or_started(args: &KafkaArgs, command: &str) -> anyhow::Result<Result<RealCluster, std::process::ExitCode>> {
        if let (Some(kafka), Some(brokers)) = (args.connect().await?, &args.brokers) {
            return Ok(Ok(RealCluster { kafka, bootstrap: brokers.clone(), describe: brokers.clone(), _nodes: None }));
        }
        let home = match herald_cluster::kafka_home_from_env() {
            Ok(home) => home,
            Err(e) => {
                eprintln!("error: `{command}` needs --kafka BROKERS, or the broker's jars to start three nodes: {e:#}");
                return Ok(Err(std::process::ExitCode::from(2)));
            }
        };
        let dir = tempfile::tempdir()?;
        eprintln!("starting a three-node Apache Kafka cluster from {}", home.display());
        // The brokers' steady state is what a benchmark measures.
        let cluster =
            tokio::task::block_in_place(|| herald_cluster::Cluster::start_with(&home, dir.path(), 3, herald_cluster::Jit::Steady))?;
        let bootstrap = cluster.bootstrap();
        let describe = format!("three private nodes, {bootstrap}");
        Ok(Ok(RealCluster { kafka: KafkaConfig::new(&bootstrap), bootstrap, describe, _nodes: Some((cluster, dir)) }))
    }
}

/// Deletes topics a benchmark created on a real cluster once it is done
/// with them: a cluster that serves run after run otherwise gathers idle
/// partitions, and its brokers slow down under them (every replica fetch
/// walks the partitions it follows: the latency benchmark's floor went from
/// 45 ms p99 to 150 ms and more on a cluster that had served fifteen runs).
pub(crate) async fn delete_topics(kafka: &KafkaConfig, topics: &[&str]) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = kafka.admin().create()?;
    let options = AdminOptions::new().operation_timeout(Some(std::time::Duration::from_secs(30)));
    for result in admin.delete_topics(topics, &options).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((topic, code)) => anyhow::bail!("deleting topic {topic}: {code}"),
        }
    }
    Ok(())
}
