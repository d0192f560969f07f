//! The export domain: intake, the fenced job lifecycle, the worker and
//! artifacts.
//!
//! - [`intake`]: request validation and its canonical fingerprint (no IO).
//! - [`lifecycle`]: states, leases, retry budget as rules (no IO).
//! - [`jobs`]: intake transaction (intent + job + outbox command) and reads.
//! - [`attempts`]: start (generation + 1), renew, complete, fail — each a
//!   conditional update on job id + generation, so a stale attempt changes
//!   nothing.
//! - [`deletion`]: the owner's delete (job `deleted` + `export.deleted` in
//!   the outbox, one transaction).
//! - [`scanner`]: takes over jobs whose lease or dispatch deadline passed.
//! - [`cleanup`]: removes candidate artifacts no attempt can select any more.
//! - [`worker`]: consumes export commands and runs attempts.
//! - [`artifact`]: rendering and create-only, verified storage of results.

pub mod artifact;
pub mod attempts;
pub mod cleanup;
pub mod deletion;
pub mod intake;
pub mod jobs;
pub mod lifecycle;
pub mod scanner;
pub mod worker;

mod error;

pub use error::ExportError;
pub use intake::{ExportRequest, Format};
pub use jobs::{IntakeConfig, Job, Submitted};
pub use lifecycle::LeasePolicy;

use herald_fault::{Action, Hook, Point};

/// Runs `hook` at one of the export's fault points; a `Fail` becomes an
/// error for `?`.
pub(crate) async fn fault_at(hook: &Hook, point: Point, job_id: &str, generation: i64) -> Result<Action, ExportError> {
    match hook.at(point, job_id, generation).await {
        Action::Fail(message) => Err(ExportError::Injected { point, message }),
        other => Ok(other),
    }
}

/// Operation name under which intake keys are scoped.
pub const OPERATION_CREATE: &str = "export.create";
