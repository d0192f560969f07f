//! Gather the evidence, then check it.

use std::time::Duration;

use herald_export::artifact::ArtifactStore;
use herald_kafka::{KafkaConfig, Topics};
use herald_store::Db;

use crate::model::Evidence;
use crate::{AuditError, Report, artifacts, checks, db, kafka, provider};

/// Where the evidence lives.
pub struct Sources<'a> {
    pub db: &'a Db,
    pub kafka: &'a KafkaConfig,
    pub topics: &'a Topics,
    /// The artifact store; without it existence of results is not checked.
    pub artifacts: Option<ArtifactStore>,
    /// The notification provider (reference receiver); without it the
    /// notification check is skipped.
    pub provider_url: Option<String>,
    /// How long reading the Kafka history may take.
    pub kafka_timeout: Duration,
    /// How far the clocks of the hosts that wrote the rows may disagree:
    /// facts this close above a prune horizon are not checked either.
    pub clock_skew: Duration,
}

/// Default of [`Sources::clock_skew`].
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(60);

/// Reads the database first, then Kafka: every row the snapshot calls
/// delivered was acknowledged before it was marked, so the later read of
/// Kafka holds it. Meant for a settled system (see the crate doc).
pub async fn gather(sources: &Sources<'_>) -> Result<Evidence, AuditError> {
    let skew_ms = i64::try_from(sources.clock_skew.as_millis()).unwrap_or(i64::MAX);
    let db = db::read(sources.db, skew_ms).await?;
    let topics = [sources.topics.commands.clone(), sources.topics.events.clone()];
    let kafka = kafka::read(sources.kafka, &topics, sources.kafka_timeout).await?;
    let stored_artifacts = match &sources.artifacts {
        Some(store) => Some(artifacts::stored_results(store, &db).await?),
        None => None,
    };
    let provider_effects = match &sources.provider_url {
        Some(url) => Some(provider::effects_by_key(url).await?),
        None => None,
    };
    Ok(Evidence { db, kafka, stored_artifacts, provider_effects })
}

/// Gathers and checks everything.
pub async fn audit(sources: &Sources<'_>) -> Result<(Report, Evidence), AuditError> {
    let evidence = gather(sources).await?;
    let report = Report::new(checks::all(&evidence)).with_horizons(&evidence.db.horizons);
    Ok((report, evidence))
}
