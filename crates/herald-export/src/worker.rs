//! The export worker: one command in, at most one selected result and one
//! completion event out. Its dedup is the job's state and generation, not an
//! inbox: a command for a job that is finished or held by a live attempt
//! changes nothing.

use std::time::Duration;

use herald_consumer::{ProcessError, Processed, Processor};
use herald_envelope::{EventData, ExportRequested, decode_record};
use herald_kafka::Topics;
use herald_store::Db;
use rdkafka::message::OwnedMessage;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::ExportError;
use crate::artifact::{ArtifactStore, StoredArtifact, render};
use crate::attempts::{self, Attempt, Completion, FailureOutcome, Resolved};
use crate::lifecycle::LeasePolicy;
use herald_fault::{Hook, Point};

/// Subscription name of the workers: consumer group `herald.export-workers`,
/// and the scope of the commands they dead-letter.
pub const SUBSCRIPTION: &str = "export-workers";

/// How one command ended, for callers that drive the worker directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Completed {
        generation: i64,
        result_id: String,
    },
    /// Finished, or held by a live attempt: nothing done.
    Skipped,
    /// The attempt lost the job to a newer generation; its candidate is an orphan.
    Refused {
        generation: i64,
        orphan: String,
    },
    Retrying {
        generation: i64,
    },
    Failed {
        generation: i64,
    },
}

pub struct ExportWorker {
    db: Db,
    topics: Topics,
    artifacts: ArtifactStore,
    policy: LeasePolicy,
    faults: Hook,
    owner: String,
}

impl ExportWorker {
    pub fn new(db: Db, topics: Topics, artifacts: ArtifactStore, policy: LeasePolicy, faults: Hook) -> ExportWorker {
        let owner = format!("worker-{}", uuid::Uuid::new_v4().simple());
        ExportWorker { db, topics, artifacts, policy, faults, owner }
    }

    /// Runs the job a command names, if it is this worker's to run.
    pub async fn handle(&self, job_id: &str) -> Result<Outcome, ExportError> {
        crate::fault_at(&self.faults, Point::BeforeStart, job_id, 0).await?;
        let Some(attempt) = attempts::start(&self.db, job_id, &self.owner, &self.policy).await? else {
            debug!(job_id, "job finished or held by a live attempt; command skipped");
            return Ok(Outcome::Skipped);
        };
        tracing::Span::current().record("generation", attempt.generation);
        info!(job_id, generation = attempt.generation, "attempt started");
        // The renewal is part of the attempt's future, not a task of its own:
        // whatever drops the attempt (crash, cancellation) stops renewing too.
        let outcome = tokio::select! {
            outcome = self.run_attempt(&attempt) => outcome,
            () = keep_lease(&self.db, &attempt, &self.policy) => Err(ExportError::LeaseLost),
        };
        match outcome {
            Ok(outcome) => Ok(outcome),
            Err(e) if e.is_retryable() => self.fail(&attempt, &e).await,
            // Lost lease or a defect: the scanner or a newer attempt owns the job now.
            Err(e) => {
                warn!(job_id, generation = attempt.generation, error = %e, "attempt abandoned");
                Ok(Outcome::Refused { generation: attempt.generation, orphan: String::new() })
            }
        }
    }

    async fn run_attempt(&self, attempt: &Attempt) -> Result<Outcome, ExportError> {
        let result_id = ArtifactStore::candidate_key(&attempt.job, attempt.generation);
        attempts::register_candidate(&self.db, attempt, &result_id).await?;
        let artifact = self.artifacts.put_candidate(&result_id, render(&attempt.job)).await?;
        crate::fault_at(&self.faults, Point::ArtifactWritten, &attempt.job.job_id, attempt.generation).await?;
        self.complete(attempt, &artifact).await
    }

    async fn complete(&self, attempt: &Attempt, artifact: &StoredArtifact) -> Result<Outcome, ExportError> {
        let job_id = &attempt.job.job_id;
        let generation = attempt.generation;
        loop {
            match attempts::complete(&self.db, &self.topics, attempt, artifact, &self.faults).await? {
                Completion::Completed => {
                    info!(job_id, generation, result_id = %artifact.result_id, "export succeeded");
                    return Ok(Outcome::Completed { generation, result_id: artifact.result_id.clone() });
                }
                Completion::Refused => {
                    warn!(job_id, generation, orphan = %artifact.result_id, "stale attempt refused; candidate left as orphan");
                    return Ok(Outcome::Refused { generation, orphan: artifact.result_id.clone() });
                }
                Completion::Unknown(reason) => {
                    warn!(job_id, generation, %reason, "completion outcome unknown; reading the job");
                    match attempts::resolve_unknown(&self.db, attempt, &artifact.result_id).await? {
                        Resolved::Committed => {
                            return Ok(Outcome::Completed { generation, result_id: artifact.result_id.clone() });
                        }
                        Resolved::NotCommitted => continue,
                        Resolved::Stale => {
                            return Ok(Outcome::Refused { generation, orphan: artifact.result_id.clone() });
                        }
                    }
                }
            }
        }
    }

    async fn fail(&self, attempt: &Attempt, error: &ExportError) -> Result<Outcome, ExportError> {
        let generation = attempt.generation;
        let jitter: f64 = rand::random();
        let outcome = attempts::record_failure(&self.db, &self.topics, attempt, &error.to_string(), &self.policy, jitter).await?;
        warn!(job_id = %attempt.job.job_id, generation, error = %error, ?outcome, "attempt failed");
        Ok(match outcome {
            FailureOutcome::Retrying { .. } => Outcome::Retrying { generation },
            FailureOutcome::Failed => Outcome::Failed { generation },
            FailureOutcome::Stale => Outcome::Refused { generation, orphan: String::new() },
        })
    }
}

/// Renews the lease at a third of its length; returns when the job is no
/// longer this attempt's, so the attempt stops early instead of finishing
/// work that its completion would refuse anyway.
async fn keep_lease(db: &Db, attempt: &Attempt, policy: &LeasePolicy) {
    let period = (policy.lease / 3).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(period).await;
        match attempts::renew(db, attempt, policy).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => warn!(job_id = %attempt.job.job_id, error = %e, "lease renewal failed; retrying"),
        }
    }
}

impl Processor for ExportWorker {
    /// A command that does not decode, or whose job the database refuses for
    /// good, is permanent: the runtime dead-letters it. A command that ran an
    /// attempt is applied; one whose job is finished or held by a live
    /// attempt changed nothing, which is what a redrive reports.
    async fn process(&self, msg: &OwnedMessage) -> Result<Processed, ProcessError> {
        let event = decode_record(msg).map_err(|e| ProcessError::Permanent(e.to_string()))?;
        if event.event_type != ExportRequested::EVENT_TYPE {
            return Ok(Processed::Ignored);
        }
        let command: ExportRequested = event.data_as().map_err(|e| ProcessError::Permanent(e.to_string()))?;
        // The attempt continues the trace of the request that created the job.
        let span = info_span!(parent: None, "export.attempt", job_id = %command.job_id, event_id = %event.key.id, generation = tracing::field::Empty);
        herald_trace::set_parent(&span, event.trace.as_ref());
        match self.handle(&command.job_id).instrument(span).await {
            Ok(Outcome::Skipped) => Ok(Processed::Unchanged),
            Ok(_) => Ok(Processed::Applied),
            Err(e) if e.is_retryable() => Err(ProcessError::Retryable(e.to_string())),
            Err(e) => Err(ProcessError::Permanent(e.to_string())),
        }
    }
}
