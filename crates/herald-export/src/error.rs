use herald_store::StoreError;
use thiserror::Error;

use herald_fault::Point;

/// Export-domain failures, each naming what the caller should do.
#[derive(Debug, Error)]
pub enum ExportError {
    /// The request is malformed or invalid: reject it (HTTP 422); nothing written.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The intake key was used before with different parameters: reject it
    /// (HTTP 409); nothing written.
    #[error("idempotency key already used with different parameters (job {job_id})")]
    KeyConflict { job_id: String },
    /// The caller has too many unfinished jobs: reject now, retry after the
    /// hint (HTTP 429); nothing written.
    #[error("{open} unfinished jobs, quota is {quota}")]
    QuotaExceeded { open: i64, quota: i64, retry_after_secs: u64 },
    /// The database failed: retry (the request with the same key, the attempt
    /// through the job's lease).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The artifact store failed: retry the attempt.
    #[error("artifact store: {0}")]
    Artifact(#[from] object_store::Error),
    /// A stored artifact is not what was written: retry the attempt under a
    /// new generation; never select it.
    #[error("artifact {result_id} failed verification: {reason}")]
    ArtifactCorrupt { result_id: String, reason: String },
    /// The attempt's lease was renewed by nobody or taken over: stop; the job
    /// belongs to a newer generation now.
    #[error("lease lost: the job was taken over")]
    LeaseLost,
    /// Event data could not be encoded: a defect, not retryable.
    #[error(transparent)]
    Envelope(#[from] herald_envelope::EnvelopeError),
    /// A fault injected at a named point (tests, `HERALD_FAULT`): behaves like
    /// a retryable infrastructure failure.
    #[error("injected fault at {point}: {message}")]
    Injected { point: Point, message: String },
}

impl ExportError {
    /// Whether trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            ExportError::Store(e) => e.is_retryable(),
            ExportError::Artifact(_) | ExportError::ArtifactCorrupt { .. } | ExportError::Injected { .. } => true,
            ExportError::LeaseLost
            | ExportError::Invalid(_)
            | ExportError::KeyConflict { .. }
            | ExportError::QuotaExceeded { .. }
            | ExportError::Envelope(_) => false,
        }
    }
}
