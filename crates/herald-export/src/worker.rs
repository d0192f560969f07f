//! The export worker: one command in, one artifact and at most one
//! completion out. Its dedup is the job's state, not an inbox: completion is
//! conditional, so a redelivered command for a finished job does nothing.

use herald_consumer::{ProcessError, Processor};
use herald_envelope::{EventData, ExportRequested, decode_record};
use herald_kafka::Topics;
use herald_store::Db;
use rdkafka::message::BorrowedMessage;
use tracing::{debug, info, warn};

use crate::artifact::{ArtifactStore, render};
use crate::{ExportError, jobs};

/// Subscription name of the workers, and so consumer group `herald.export-workers`.
pub const SUBSCRIPTION: &str = "export-workers";

pub struct ExportWorker {
    db: Db,
    topics: Topics,
    artifacts: ArtifactStore,
}

impl ExportWorker {
    pub fn new(db: Db, topics: Topics, artifacts: ArtifactStore) -> ExportWorker {
        ExportWorker { db, topics, artifacts }
    }

    async fn run_job(&self, command: &ExportRequested) -> Result<(), ExportError> {
        let Some(job) = jobs::get_any(&self.db, &command.job_id).await? else {
            return Err(ExportError::Invalid(format!("command for unknown job {}", command.job_id)));
        };
        if job.status != jobs::PENDING {
            debug!(job_id = %job.job_id, status = %job.status, "command for a job no longer pending; ignored");
            return Ok(());
        }
        let attempt = uuid::Uuid::now_v7().to_string();
        let artifact = self.artifacts.put_candidate(&job, &attempt, render(&job)).await?;
        if jobs::complete(&self.db, &self.topics, &job, &artifact).await? {
            info!(job_id = %job.job_id, result_id = %artifact.result_id, "export succeeded");
        } else {
            warn!(job_id = %job.job_id, orphan = %artifact.result_id, "job completed by another attempt; candidate left as orphan");
        }
        Ok(())
    }
}

impl Processor for ExportWorker {
    async fn process(&self, msg: &BorrowedMessage<'_>) -> Result<(), ProcessError> {
        let event = decode_record(msg).map_err(|e| ProcessError::Permanent(e.to_string()))?;
        if event.event_type != ExportRequested::EVENT_TYPE {
            return Ok(());
        }
        let command: ExportRequested = event.data_as().map_err(|e| ProcessError::Permanent(e.to_string()))?;
        self.run_job(&command).await.map_err(|e| match e {
            ExportError::Store(s) if !s.is_retryable() => ProcessError::Permanent(s.to_string()),
            ExportError::Store(_) | ExportError::Artifact(_) => ProcessError::Retryable(e.to_string()),
            other => ProcessError::Permanent(other.to_string()),
        })
    }
}
