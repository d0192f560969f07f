//! Readiness (`GET /readyz`): 200 only while every dependency of this
//! process answers (the database, the broker) and every role it started is
//! running; 503 otherwise. `/healthz` stays the liveness probe: a process
//! whose broker is down is alive (restarting it would not help) but should
//! get no traffic.
//!
//! A probe is answered from a result at most [`FRESH_FOR`] old, taken by one
//! request at a time, so a flood of probes on the unauthenticated path costs
//! the database and the broker one check each per interval. Why a check
//! failed goes to the log only, under an id the answer repeats.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use tracing::{Instrument, warn};
use utoipa::ToSchema;

use crate::problem::Problem;

/// How long one check result answers probes.
pub const FRESH_FOR: Duration = Duration::from_secs(1);
/// Longest a dependency may take to answer before it counts as down.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// A dependency check: `Err` carries the reason, for the log.
pub type Check = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Where a role of this process stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RoleState {
    Starting,
    Running,
    Stopped,
}

impl RoleState {
    pub fn as_str(self) -> &'static str {
        match self {
            RoleState::Starting => "starting",
            RoleState::Running => "running",
            RoleState::Stopped => "stopped",
        }
    }
}

/// What `/readyz` answers when the process is ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Report {
    pub ready: bool,
    /// Each dependency: `ok`, or `not answering (see log <id>)`.
    pub dependencies: BTreeMap<String, String>,
    pub roles: BTreeMap<String, RoleState>,
}

#[derive(Clone)]
pub struct Readiness {
    inner: Arc<Inner>,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness::fresh_for(FRESH_FOR)
    }
}

struct Inner {
    fresh_for: Duration,
    checks: Mutex<Vec<(String, Check)>>,
    roles: Mutex<BTreeMap<String, RoleState>>,
    /// The last dependency results; the async lock makes one request check
    /// while the others wait for its result.
    last: tokio::sync::Mutex<Option<(Instant, BTreeMap<String, String>)>>,
}

impl Readiness {
    pub fn new() -> Readiness {
        Readiness::default()
    }

    /// Dependency results answer probes for `fresh_for`.
    pub fn fresh_for(fresh_for: Duration) -> Readiness {
        let inner = Inner { fresh_for, checks: Mutex::default(), roles: Mutex::default(), last: tokio::sync::Mutex::default() };
        Readiness { inner: Arc::new(inner) }
    }

    /// Adds a dependency that must answer for the process to be ready.
    pub fn depends_on(&self, name: &str, check: Check) {
        lock(&self.inner.checks).push((name.to_owned(), check));
    }

    /// Declares a role this process starts: not ready until its task runs
    /// ([`Role::running`]), and not ready again once it ends.
    pub fn role(&self, name: &str) -> Role {
        lock(&self.inner.roles).insert(name.to_owned(), RoleState::Starting);
        Role { readiness: self.clone(), name: name.to_owned() }
    }

    fn set(&self, name: &str, state: RoleState) {
        lock(&self.inner.roles).insert(name.to_owned(), state);
    }

    pub async fn report(&self) -> Report {
        let dependencies = self.dependencies().await;
        let roles = lock(&self.inner.roles).clone();
        let ready = dependencies.values().all(|d| d == "ok") && roles.values().all(|r| *r == RoleState::Running);
        Report { ready, dependencies, roles }
    }

    async fn dependencies(&self) -> BTreeMap<String, String> {
        let mut last = self.inner.last.lock().await;
        if let Some((at, results)) = last.as_ref()
            && at.elapsed() < self.inner.fresh_for
        {
            return results.clone();
        }
        let checks = lock(&self.inner.checks).clone();
        let mut results = BTreeMap::new();
        for (name, check) in checks {
            let outcome = match tokio::time::timeout(CHECK_TIMEOUT, check()).await {
                Ok(outcome) => outcome,
                Err(_) => Err(format!("no answer within {CHECK_TIMEOUT:?}")),
            };
            let shown = match outcome {
                Ok(()) => "ok".to_owned(),
                Err(reason) => {
                    let id = uuid::Uuid::new_v4();
                    warn!(dependency = %name, %reason, error_id = %id, "readiness: a dependency does not answer");
                    format!("not answering (see log {id})")
                }
            };
            results.insert(name, shown);
        }
        *last = Some((Instant::now(), results.clone()));
        results
    }
}

/// A declared role; mark it running from inside its task. Dropping it (the
/// task ended, returned an error or panicked) marks the role stopped.
pub struct Role {
    readiness: Readiness,
    name: String,
}

impl Role {
    pub fn running(&self) {
        self.readiness.set(&self.name, RoleState::Running);
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        self.readiness.set(&self.name, RoleState::Stopped);
    }
}

/// Runs `task` as the role `role`: running while it runs, stopped after;
/// inside the role's own span, so its log lines carry trace ids.
pub async fn track<T>(role: Role, task: impl Future<Output = T>) -> T {
    role.running();
    let out = task.instrument(herald_trace::run_span(&role.name)).await;
    drop(role);
    out
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these locks leaves plain data; keep serving it.
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `GET /readyz`, open like `/healthz` (it says nothing internal).
pub fn routes(readiness: Readiness) -> Router {
    Router::new().route("/readyz", get(readyz)).with_state(readiness)
}

/// Readiness: 200 while the database and the broker answer and every role
/// of this process runs; otherwise 503 naming what is not (the reasons stay
/// in the log, under the ids the detail gives). Needs no token.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready: every dependency answers, every role runs", body = Report),
        (status = 503, description = "Not ready: the detail names each dependency not answering and each role not running",
            body = Problem, content_type = "application/problem+json"),
    ))]
pub(crate) async fn readyz(State(readiness): State<Readiness>) -> Response {
    let report = readiness.report().await;
    if report.ready {
        return (StatusCode::OK, Json(report)).into_response();
    }
    Problem::unready(report.shortfall()).into_response()
}

impl Report {
    /// What keeps the process from being ready, in words.
    pub fn shortfall(&self) -> String {
        let dependencies = self.dependencies.iter().filter(|(_, d)| *d != "ok").map(|(name, d)| format!("{name}: {d}"));
        let roles = self.roles.iter().filter(|(_, r)| **r != RoleState::Running).map(|(name, r)| format!("role {name}: {}", r.as_str()));
        dependencies.chain(roles).collect::<Vec<_>>().join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answering(ok: bool) -> Check {
        Arc::new(move || Box::pin(async move { if ok { Ok(()) } else { Err("connection refused".to_owned()) } }))
    }

    #[tokio::test]
    async fn ready_only_with_every_dependency_and_every_role_running() {
        let readiness = Readiness::new();
        readiness.depends_on("database", answering(true));
        let relay = readiness.role("relay");
        assert!(!readiness.report().await.ready, "a declared role that has not started");
        relay.running();
        let report = readiness.report().await;
        assert!(report.ready, "{report:?}");
        drop(relay);
        assert_eq!(readiness.report().await.roles["relay"], RoleState::Stopped);
        assert!(!readiness.report().await.ready);
    }

    #[tokio::test]
    async fn a_failing_dependency_is_named_without_its_reason() {
        let readiness = Readiness::new();
        readiness.depends_on("broker", answering(false));
        let report = readiness.report().await;
        assert!(!report.ready);
        assert!(report.dependencies["broker"].starts_with("not answering (see log "), "{report:?}");
        assert!(!report.dependencies["broker"].contains("refused"), "the reason stays in the log");
    }

    #[tokio::test]
    async fn a_result_answers_probes_while_it_is_fresh() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = calls.clone();
        let readiness = Readiness::fresh_for(Duration::from_secs(3600));
        readiness.depends_on(
            "database",
            Arc::new(move || {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Box::pin(async { Ok(()) })
            }),
        );
        for _ in 0..5 {
            readiness.report().await;
        }
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1, "one check while the result is fresh");
        let expired = Readiness::fresh_for(Duration::ZERO);
        let counted = calls.clone();
        expired.depends_on(
            "database",
            Arc::new(move || {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Box::pin(async { Ok(()) })
            }),
        );
        expired.report().await;
        expired.report().await;
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3, "a stale result is taken again");
    }
}
