//! The export domain: intake, the job lifecycle, the worker and artifacts.
//!
//! - [`intake`]: request validation and its canonical fingerprint (no IO).
//! - [`jobs`]: the sqlx adapter — intent + job + outbox command in one
//!   transaction; conditional completion + outbox event in another.
//! - [`worker`]: consumes export commands, writes the artifact, completes.
//! - [`artifact`]: rendering and create-only storage of result files.

pub mod artifact;
pub mod intake;
pub mod jobs;
pub mod worker;

mod error;

pub use error::ExportError;
pub use intake::{ExportRequest, Format};
pub use jobs::{Job, Submitted};

/// Operation name under which intake keys are scoped.
pub const OPERATION_CREATE: &str = "export.create";
