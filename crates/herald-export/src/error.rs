use herald_store::StoreError;
use thiserror::Error;

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
    /// The database failed: retry the request with the same key.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The artifact store failed: retry the attempt.
    #[error("artifact store: {0}")]
    Artifact(#[from] object_store::Error),
    /// Event data could not be encoded: a defect, not retryable.
    #[error(transparent)]
    Envelope(#[from] herald_envelope::EnvelopeError),
}
