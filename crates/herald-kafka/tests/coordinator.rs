//! A cluster moving under a question: a group coordinator that is not ready
//! yet (being elected, loading, or the offsets topic still being created on
//! a fresh cluster) answers "not coordinator"; a partition whose leader just
//! died answers "not leader". Asking where a group stands must wait that
//! out, not fail. `herald drill` met both on Apache Kafka: the notify
//! subscription's start check exited on them (on a fresh cluster every later
//! start then found history it must refuse to notify).

use herald_kafka::EmbeddedKafka;
use herald_kafka::KafkaConfig;
use herald_kafka::offsets;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

#[tokio::test(flavor = "multi_thread")]
async fn a_coordinator_that_is_not_ready_is_waited_for() -> anyhow::Result<()> {
    let kafka = EmbeddedKafka::start(1, &["events"], 2)?;
    let not_ready = [
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
    ];
    kafka.request_errors(RDKafkaApiKey::OffsetFetch, &not_ready)?;
    let states = offsets::partition_states(&KafkaConfig::new(kafka.bootstrap_servers()), "fresh-group", "events").await?;
    assert_eq!(states.len(), 2);
    assert!(states.iter().all(|s| s.committed.is_none()), "a fresh group has no offsets: {states:?}");

    let leader_moving = [RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; 2];
    kafka.request_errors(RDKafkaApiKey::ListOffsets, &leader_moving)?;
    let states = offsets::partition_states(&KafkaConfig::new(kafka.bootstrap_servers()), "fresh-group", "events").await?;
    assert_eq!(states.len(), 2, "a leader moving is waited for");

    kafka.request_errors(RDKafkaApiKey::OffsetCommit, &not_ready)?;
    offsets::commit(&KafkaConfig::new(kafka.bootstrap_servers()), "fresh-group", "events", &[(0, 0), (1, 0)]).await?;
    let states = offsets::partition_states(&KafkaConfig::new(kafka.bootstrap_servers()), "fresh-group", "events").await?;
    assert!(states.iter().all(|s| s.committed == Some(0)), "the commit went through: {states:?}");
    Ok(())
}
