//! Fault injection, one way for every role: named [`Point`]s in the code
//! where a [`Hook`] may decide what happens — continue, fail, lose an
//! answer, or wait (a test's gate, or forever: a drill's hang) — and one
//! parser of `HERALD_FAULT` ([`Spec`]) that turns a drill's request into
//! such a hook.
//!
//! The default hook does nothing and costs one branch per point. Races and
//! crashes the invariants are about are forced with these hooks instead of
//! being hoped for with sleeps.

mod spec;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use spec::{ENV, Mode, Spec, SpecError, from_env};

/// Where a fault can strike. Names are what `HERALD_FAULT` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Point {
    /// Export intake: the key was looked up and is new; the transaction has not begun.
    IntakeChecked,
    /// Export intake: the job row is inserted, the intent and outbox row are not.
    AfterJobInsert,
    /// Export worker: about to claim the job with a conditional update.
    BeforeStart,
    /// Export worker: the attempt's candidate artifact is stored, completion not begun.
    ArtifactWritten,
    /// Export worker: the completion transaction is about to commit.
    BeforeCompletionCommit,
    /// Relay: a slice's batch was acknowledged by the broker, its progress not written.
    BeforeProgress,
    /// Subscription: a batch's transaction committed, its offsets not stored.
    AfterCommit,
    /// Dispatcher: the provider answered, the answer is not recorded.
    AfterProviderResponse,
    /// Rebuild: the topic's ends were read, the new generation is not open
    /// (the window in which records applied live could be lost to it).
    BeforeOpen,
}

impl Point {
    pub const ALL: [Point; 9] = [
        Point::IntakeChecked,
        Point::AfterJobInsert,
        Point::BeforeStart,
        Point::ArtifactWritten,
        Point::BeforeCompletionCommit,
        Point::BeforeProgress,
        Point::AfterCommit,
        Point::AfterProviderResponse,
        Point::BeforeOpen,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Point::IntakeChecked => "intake-checked",
            Point::AfterJobInsert => "after-job-insert",
            Point::BeforeStart => "before-start",
            Point::ArtifactWritten => "artifact-written",
            Point::BeforeCompletionCommit => "before-completion-commit",
            Point::BeforeProgress => "before-progress",
            Point::AfterCommit => "after-commit",
            Point::AfterProviderResponse => "after-provider-response",
            Point::BeforeOpen => "before-open",
        }
    }

    pub fn parse(name: &str) -> Option<Point> {
        Point::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Whether failing here means anything: after a commit or a provider's
    /// answer there is nothing left to fail, only a window to stop in.
    pub fn can_fail(self) -> bool {
        !matches!(self, Point::AfterCommit | Point::AfterProviderResponse | Point::BeforeOpen)
    }
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a hook was called: the point, what it was about (a job id, a slice,
/// a subscription, an idempotency key) and a number (a generation, a row
/// count, a batch number).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub point: Point,
    pub subject: String,
    pub n: i64,
}

impl fmt::Display for Site {
    /// How a drill's marker line names the site.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.point {
            Point::IntakeChecked | Point::AfterJobInsert | Point::BeforeStart | Point::ArtifactWritten | Point::BeforeCompletionCommit => {
                write!(f, "job={} generation={}", self.subject, self.n)
            }
            Point::BeforeProgress => write!(f, "slice={} rows={}", self.subject, self.n),
            Point::AfterCommit => write!(f, "subscription={} batch={}", self.subject, self.n),
            Point::AfterProviderResponse => write!(f, "key={}", self.subject),
            Point::BeforeOpen => write!(f, "projection={} generation={}", self.subject, self.n),
        }
    }
}

/// What a hook decided. An action that means nothing at a point (say,
/// losing a commit's answer where nothing commits) is taken as `Continue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Continue,
    /// Fail the operation here with this message, as an infrastructure
    /// failure would.
    Fail(String),
    /// At `before-progress`: behave as if the process died between the
    /// broker's acknowledgement and the progress write — write nothing.
    LoseAck,
    /// At `before-completion-commit`: commit, then report the outcome as
    /// unknown, as when the connection drops while the commit's answer is on
    /// its way back.
    CommitThenLoseAnswer,
    /// At `before-completion-commit`: do not commit, and report the outcome
    /// as unknown, as when the connection drops before the commit arrived.
    DropThenLoseAnswer,
}

type HookFn = dyn Fn(Site) -> Pin<Box<dyn Future<Output = Action> + Send>> + Send + Sync;

/// The fault hook every role takes; cheap to clone.
#[derive(Clone, Default)]
pub struct Hook(Option<Arc<HookFn>>);

impl fmt::Debug for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "Hook(set)" } else { "Hook(none)" })
    }
}

impl Hook {
    /// No faults: production.
    pub fn none() -> Hook {
        Hook(None)
    }

    /// Every point is passed to `hook`, which may await (a gate, or forever)
    /// or decide.
    pub fn new<F, Fut>(hook: F) -> Hook
    where
        F: Fn(Site) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Action> + Send + 'static,
    {
        Hook(Some(Arc::new(move |site| Box::pin(hook(site)))))
    }

    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// Runs the hook at `point`.
    pub async fn at(&self, point: Point, subject: &str, n: i64) -> Action {
        match &self.0 {
            None => Action::Continue,
            Some(hook) => hook(Site { point, subject: subject.to_owned(), n }).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn point_names_round_trip() {
        for point in Point::ALL {
            assert_eq!(Point::parse(point.name()), Some(point));
        }
        assert_eq!(Point::parse("artifact_written"), None);
    }

    #[tokio::test]
    async fn a_hook_sees_its_site_and_none_continues() {
        assert_eq!(Hook::none().at(Point::BeforeStart, "j", 0).await, Action::Continue);
        let hook = Hook::new(|site| async move {
            if site.point == Point::ArtifactWritten && site.n == 2 { Action::Fail(site.to_string()) } else { Action::Continue }
        });
        assert_eq!(hook.at(Point::ArtifactWritten, "j1", 2).await, Action::Fail("job=j1 generation=2".into()));
        assert_eq!(hook.at(Point::ArtifactWritten, "j1", 1).await, Action::Continue);
    }
}
