//! What one caller, or all of them together, may ask of the API at once.
//!
//! The API shares its process (and, on SQLite, its database connection) with
//! the relay and the subscriptions, so a flood of requests must be refused
//! early rather than queued: a concurrency limit for everyone and a rate per
//! caller, both answering `429` with `Retry-After`, and a body limit so a
//! request cannot make the process buffer more than an export request needs.
//! Searches, the one request whose cost grows with the data, also take one
//! of a few [`SearchSlots`], so a search flood keeps to a bounded share of
//! the database while intake and the background roles go on.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tokio::sync::Semaphore;

use crate::Tokens;
use crate::problem::Problem;

/// The limits of one API listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Requests handled at the same time; more are refused.
    pub concurrency: usize,
    /// Requests per second one caller may make, sustained.
    pub per_caller_per_sec: NonZeroU32,
    /// Requests one caller may make at once above its rate.
    pub per_caller_burst: NonZeroU32,
    /// Largest request body accepted, in bytes.
    pub body_bytes: usize,
    /// Searches running at the same time in this process.
    pub search_concurrency: usize,
}

/// Defaults of [`Limits`], also the defaults of the `--api-*` flags.
pub const DEFAULT_CONCURRENCY: u32 = 128;
pub const DEFAULT_PER_CALLER_PER_SEC: u32 = 200;
pub const DEFAULT_PER_CALLER_BURST: u32 = 400;
/// Two searches at once: on the 2-core reference machine (database, relay
/// and API on one host) twenty clients searching back to back leave the
/// relay above 80 % of its quiet rate (BENCHMARKS.md, "Search"). Raise it
/// with the database's spare cores.
pub const DEFAULT_SEARCH_CONCURRENCY: u32 = 2;
/// Longest a search waits for a slot before it is refused with `429`.
const SEARCH_SLOT_WAIT: Duration = Duration::from_secs(1);

impl Default for Limits {
    fn default() -> Self {
        Limits {
            concurrency: DEFAULT_CONCURRENCY as usize,
            per_caller_per_sec: NonZeroU32::new(DEFAULT_PER_CALLER_PER_SEC).unwrap_or(NonZeroU32::MIN),
            per_caller_burst: NonZeroU32::new(DEFAULT_PER_CALLER_BURST).unwrap_or(NonZeroU32::MIN),
            body_bytes: 64 * 1024,
            search_concurrency: DEFAULT_SEARCH_CONCURRENCY as usize,
        }
    }
}

/// Slots for searches: a search waits up to [`SEARCH_SLOT_WAIT`] for one,
/// then is refused with `429` and `Retry-After`.
#[derive(Debug, Clone)]
pub struct SearchSlots {
    slots: Arc<Semaphore>,
    concurrency: usize,
}

impl SearchSlots {
    pub fn new(concurrency: usize) -> SearchSlots {
        let concurrency = concurrency.max(1);
        SearchSlots { slots: Arc::new(Semaphore::new(concurrency)), concurrency }
    }

    /// A slot, held until the permit is dropped.
    pub async fn acquire(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Problem> {
        match tokio::time::timeout(SEARCH_SLOT_WAIT, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(Problem::rate_limited(format!("{} searches are running, the most at once; retry shortly", self.concurrency), 1)),
        }
    }
}

impl Default for SearchSlots {
    fn default() -> Self {
        SearchSlots::new(DEFAULT_SEARCH_CONCURRENCY as usize)
    }
}

#[derive(Clone)]
struct Gate {
    in_flight: Arc<Semaphore>,
    rates: Arc<DefaultKeyedRateLimiter<String>>,
    per_sec: NonZeroU32,
    tokens: Tokens,
}

/// `app` with `limits` in front of every route.
pub fn apply(app: Router, limits: Limits, tokens: Tokens) -> Router {
    let quota = Quota::per_second(limits.per_caller_per_sec).allow_burst(limits.per_caller_burst);
    let gate = Gate {
        in_flight: Arc::new(Semaphore::new(limits.concurrency)),
        rates: Arc::new(RateLimiter::keyed(quota)),
        per_sec: limits.per_caller_per_sec,
        tokens,
    };
    app.layer(middleware::from_fn_with_state(gate, admit)).layer(DefaultBodyLimit::max(limits.body_bytes))
}

async fn admit(State(gate): State<Gate>, request: Request, next: Next) -> Response {
    let Ok(_permit) = gate.in_flight.clone().try_acquire_owned() else {
        return Problem::rate_limited("the API is at its concurrency limit; retry shortly", 1).into_response();
    };
    // Keyed by the authenticated caller: a bounded set of keys. Requests
    // without a known token are not counted against anyone; the route
    // answers them 401 without touching the database.
    if let Ok(caller) = gate.tokens.caller(request.headers()) {
        if let Err(not_until) = gate.rates.check_key(&caller) {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            let detail = format!("{caller} sent more than {} requests per second", gate.per_sec);
            return Problem::rate_limited(detail, retry_after(wait)).into_response();
        }
    }
    next.run(request).await
}

/// Whole seconds to wait, at least one (`Retry-After` has no fractions).
fn retry_after(wait: Duration) -> u64 {
    u64::try_from(wait.as_millis().div_ceil(1000)).unwrap_or(u64::MAX).max(1)
}
