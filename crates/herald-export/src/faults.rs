//! Named points in the job lifecycle where tests (and `HERALD_FAULT` in the
//! binary) can fail, pause at a gate, or hang an attempt — the way to force
//! the races and crashes the invariants are about without sleeps.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::ExportError;

/// Where a fault can strike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// Intake: the key was looked up and is new; the transaction has not begun.
    IntakeChecked,
    /// Intake: the job row is inserted, the intent and outbox row are not.
    AfterJobInsert,
    /// Worker: about to claim the job with a conditional update.
    BeforeStart,
    /// Worker: the attempt's candidate artifact is stored, completion not begun.
    ArtifactWritten,
    /// Worker: the completion transaction is about to commit.
    BeforeCompletionCommit,
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            FaultPoint::IntakeChecked => "intake-checked",
            FaultPoint::AfterJobInsert => "after-job-insert",
            FaultPoint::BeforeStart => "before-start",
            FaultPoint::ArtifactWritten => "artifact-written",
            FaultPoint::BeforeCompletionCommit => "before-completion-commit",
        };
        f.write_str(name)
    }
}

impl FaultPoint {
    pub fn parse(name: &str) -> Option<FaultPoint> {
        [
            FaultPoint::IntakeChecked,
            FaultPoint::AfterJobInsert,
            FaultPoint::BeforeStart,
            FaultPoint::ArtifactWritten,
            FaultPoint::BeforeCompletionCommit,
        ]
        .into_iter()
        .find(|p| p.to_string() == name)
    }
}

/// What a fault hook decided at a point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultAction {
    Continue,
    /// Fail the operation here with this message.
    Fail(String),
    /// Only at `BeforeCompletionCommit`: commit, then report the outcome as
    /// unknown, as when the connection drops while the commit's answer is on
    /// its way back.
    CommitThenLoseAnswer,
    /// Only at `BeforeCompletionCommit`: do not commit, and report the outcome
    /// as unknown, as when the connection drops before the commit arrived.
    DropThenLoseAnswer,
}

/// Context handed to a hook.
#[derive(Debug, Clone)]
pub struct FaultContext {
    pub point: FaultPoint,
    pub job_id: String,
    pub generation: i64,
}

type Hook = dyn Fn(FaultContext) -> Pin<Box<dyn Future<Output = FaultAction> + Send>> + Send + Sync;

/// A set of fault hooks; the default has none and costs one branch per point.
#[derive(Clone, Default)]
pub struct Faults {
    hook: Option<Arc<Hook>>,
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.hook.is_some() { "Faults(hooked)" } else { "Faults(none)" })
    }
}

impl Faults {
    pub fn none() -> Faults {
        Faults::default()
    }

    /// Every point is passed to `hook`, which may await (a gate) or decide.
    pub fn hook<F, Fut>(hook: F) -> Faults
    where
        F: Fn(FaultContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = FaultAction> + Send + 'static,
    {
        Faults { hook: Some(Arc::new(move |ctx| Box::pin(hook(ctx)))) }
    }

    /// Runs the hook at `point`; `Fail` becomes an error for `?`.
    pub async fn at(&self, point: FaultPoint, job_id: &str, generation: i64) -> Result<FaultAction, ExportError> {
        let Some(hook) = &self.hook else { return Ok(FaultAction::Continue) };
        let ctx = FaultContext { point, job_id: job_id.to_owned(), generation };
        match hook(ctx).await {
            FaultAction::Fail(message) => Err(ExportError::Injected { point, message }),
            other => Ok(other),
        }
    }
}
