//! Where a benchmark publishes: librdkafka's in-process mock cluster by
//! default (so the broker is not the bottleneck), or the cluster given with
//! `--kafka` — the figures users compare with — on topics of the run's own,
//! created with Herald's durability defaults (3 replicas and
//! `min.insync.replicas` 2 on three brokers).

use herald_kafka::{EmbeddedKafka, KafkaConfig, TopicSettings};
use herald_wiring::connection::KafkaArgs;

pub(crate) struct BenchBroker {
    pub kafka: KafkaConfig,
    pub bootstrap: String,
    /// Keeps the mock cluster alive for the run; `None` on a real cluster.
    mock: Option<EmbeddedKafka>,
}

impl BenchBroker {
    /// Creates `topics` (names unique to the run on a real cluster).
    pub async fn start(args: &KafkaArgs, topics: &[&str], partitions: i32) -> anyhow::Result<BenchBroker> {
        if let (Some(kafka), Some(brokers)) = (args.connect().await?, &args.brokers) {
            herald_kafka::ensure_topics(&kafka, topics, TopicSettings::partitions(partitions)).await?;
            return Ok(BenchBroker { kafka, bootstrap: brokers.clone(), mock: None });
        }
        let mock = EmbeddedKafka::start(1, topics, partitions)?;
        let bootstrap = mock.bootstrap_servers().to_owned();
        Ok(BenchBroker { kafka: KafkaConfig::new(&bootstrap), bootstrap, mock: Some(mock) })
    }

    /// For the table and the JSON: `mock` or the bootstrap list.
    pub fn describe(&self) -> String {
        if self.mock.is_some() { "in-process mock cluster".to_owned() } else { self.bootstrap.clone() }
    }
}
