//! Records are data from outside the process: a stranger's source (in a
//! CloudEvent or in the legacy envelope) and a number out of range are
//! dead-lettered with a reason naming what was wrong, and the records after
//! them still apply. A subscription told to accept a partner's sources
//! (`--accept-source`) applies theirs.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use herald::bench::workload;
use herald::subscriptions::{self, Name};
use herald_consumer::{Metrics, SubscriptionOptions};
use herald_envelope::legacy::to_legacy_json;
use herald_envelope::{ExportCompleted, OutboxEvent, Registry, Sources};
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_projections::stats;
use herald_store::{Db, dead_letter};
use herald_testkit::wait_until;
use tokio_util::sync::CancellationToken;

const PATIENCE: Duration = Duration::from_secs(120);

struct Bed {
    db: Db,
    kafka: EmbeddedKafka,
    topics: Topics,
    run: String,
    _test_db: herald_testkit::TestDb,
}

async fn bed() -> anyhow::Result<Bed> {
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let topics = Topics::with_prefix(&herald_testkit::unique("untrusted"));
    let kafka = EmbeddedKafka::start(1, &topics.all(), 1)?;
    Ok(Bed { db, kafka, topics, run: herald_testkit::unique("run"), _test_db: test_db })
}

impl Bed {
    fn event(&self, i: usize, source: &str, data: &ExportCompleted) -> anyhow::Result<OutboxEvent> {
        let mut event = OutboxEvent::new(&self.topics.events, &format!("{}-{i}", self.run), data, Utc::now())?;
        event.source = source.to_owned();
        Ok(event)
    }

    /// Runs stats with `registry` until `applied` records applied and
    /// `dead` dead-lettered; returns the letters' errors.
    async fn stats_until(&self, registry: Registry, applied: u64, dead: usize) -> anyhow::Result<Vec<String>> {
        let kafka = KafkaConfig::new(self.kafka.bootstrap_servers());
        let sub = Name::Stats.subscription(&herald_testkit::unique("g"), &kafka, &self.topics.events);
        let options = SubscriptionOptions { registry, ..SubscriptionOptions::default() };
        let (metrics, stop) = (Arc::new(Metrics::default()), CancellationToken::new());
        let (db, m, token) = (self.db.clone(), metrics.clone(), stop.clone());
        let task = tokio::spawn(async move { subscriptions::run(Name::Stats, &db, &sub, &options, &m, token).await });
        let db = self.db.clone();
        let waited = wait_until("stats to apply and set aside what it must", PATIENCE, || {
            let (m, db) = (metrics.clone(), db.clone());
            async move { Ok(m.snapshot().applied >= applied && dead_letter::list(&db, Some("stats"), None).await?.len() >= dead) }
        })
        .await;
        stop.cancel();
        task.await??;
        waited?;
        Ok(dead_letter::list(&self.db, Some("stats"), None).await?.into_iter().map(|l| l.error).collect())
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn strangers_and_numbers_out_of_range_are_dead_lettered_naming_why() -> anyhow::Result<()> {
    let bed = bed().await?;
    let producer = workload::producer(&KafkaConfig::new(bed.kafka.bootstrap_servers()))?;
    let good = workload::completion(&bed.run, 0);
    let stranger = bed.event(1, "/mallory", &workload::completion(&bed.run, 1))?;
    let huge =
        bed.event(2, herald_envelope::SOURCE_EXPORTS, &ExportCompleted { size_bytes: i64::MAX, ..workload::completion(&bed.run, 2) })?;
    workload::publish(&producer, &[stranger, huge]).await?;
    // The legacy envelope accepted any source starting with `/` before.
    let legacy = bed.event(3, herald_envelope::SOURCE_EXPORTS, &workload::completion(&bed.run, 3))?;
    let value = to_legacy_json(&legacy.key(), "/mallory/legacy", &legacy.subject, &workload::completion(&bed.run, 3))?;
    workload::publish_raw(&producer, &bed.topics.events, &legacy.partition_key, &value, None).await?;
    workload::publish(&producer, &[bed.event(0, herald_envelope::SOURCE_EXPORTS, &good)?]).await?;

    let errors = bed.stats_until(Registry::embedded(), 1, 3).await?;
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert_eq!(errors.iter().filter(|e| e.contains("untrusted source `/mallory`")).count(), 1, "{errors:#?}");
    assert_eq!(errors.iter().filter(|e| e.contains("untrusted source `/mallory/legacy`")).count(), 1, "{errors:#?}");
    assert_eq!(errors.iter().filter(|e| e.contains("field `size_bytes` out of range")).count(), 1, "{errors:#?}");
    assert_eq!(stats::total_exports(&bed.db).await?, 1, "only the good record counted");

    // A redrive trusts what the subscription trusts (`herald dlq
    // --accept-source`): refused again by default, applied once accepted.
    let letters = dead_letter::list(&bed.db, Some("stats"), Some(dead_letter::DEAD)).await?;
    let stranger = letters.iter().find(|l| l.error.contains("untrusted source `/mallory`")).expect("the stranger's letter");
    subscriptions::redrive(&bed.db, &Registry::embedded(), &Default::default(), stranger).await?;
    assert_eq!(stats::total_exports(&bed.db).await?, 1, "still untrusted");
    let trusting = Registry::embedded().accepting(Sources::new(["/mallory".to_owned(), herald_envelope::SOURCE_EXPORTS.to_owned()])?);
    let letter = dead_letter::get(&bed.db, stranger.id).await?.expect("still there");
    let outcome = subscriptions::redrive(&bed.db, &trusting, &Default::default(), &letter).await?;
    assert!(matches!(outcome.redriven, herald_consumer::Redriven::Applied), "{:?}", outcome.redriven);
    assert_eq!(stats::total_exports(&bed.db).await?, 2, "applied once its source is accepted");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partners_source_applies_once_accepted() -> anyhow::Result<()> {
    let bed = bed().await?;
    let producer = workload::producer(&KafkaConfig::new(bed.kafka.bootstrap_servers()))?;
    let events = [
        bed.event(0, "/partner/eu", &workload::completion(&bed.run, 0))?,
        bed.event(1, herald_envelope::SOURCE_EXPORTS, &workload::completion(&bed.run, 1))?,
    ];
    workload::publish(&producer, &events).await?;
    let sources = Sources::new(["/partner/*".to_owned(), herald_envelope::SOURCE_EXPORTS.to_owned()])?;
    let errors = bed.stats_until(Registry::embedded().accepting(sources), 2, 0).await?;
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(stats::total_exports(&bed.db).await?, 2);
    Ok(())
}
