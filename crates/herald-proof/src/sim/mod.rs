//! `herald provider-sim`: a reference notification receiver with a durable
//! ledger, used to prove where duplicates come from. Keyed mode honours
//! `Idempotency-Key` (same key and body replays the stored result; same key,
//! other body answers 409 and keeps the old effect); unkeyed mode executes
//! every request. Fault switches reproduce the lost-acknowledgement windows: the
//! answer lost after the commit, the process dying after the commit,
//! connections refused, and calls held until released. Slow mode ([`slow`])
//! answers around the caller's timeout and sometimes drops the connection
//! after executing; the ledger counts every request whose answer may not
//! have reached the caller.

mod ledger;
mod listener;
pub mod slow;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{Mutex, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info};

pub use ledger::{Applied, KeyEffects, KeyRequests, Ledger, Totals};
pub use listener::{ConnCut, RefusableListener, RefuseSwitch};
pub use slow::{Ambiguity, Plan, Slowness};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Keyed,
    Unkeyed,
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub mode: Mode,
    /// How long keys are remembered (keyed mode).
    pub key_retention: Duration,
    /// Answer around the caller's timeout (the adversarial drill's slow modes).
    pub slow: Option<Slowness>,
}

impl SimConfig {
    pub fn keyed(key_retention: Duration) -> SimConfig {
        SimConfig { mode: Mode::Keyed, key_retention, slow: None }
    }

    pub fn unkeyed() -> SimConfig {
        SimConfig { mode: Mode::Unkeyed, key_retention: Duration::ZERO, slow: None }
    }
}

/// Fault switches, settable at start or through `POST /faults`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FaultSwitches {
    /// The next N executed requests commit their effect, then never answer.
    #[serde(default)]
    pub drop_responses: u32,
    /// The next executed request commits its effect, then the process exits.
    #[serde(default)]
    pub exit_after_commit: bool,
    /// Hold every request before it executes, until set to false.
    #[serde(default)]
    pub pause: bool,
    /// Close the listening socket for this long.
    #[serde(default)]
    pub refuse_for_ms: u64,
}

#[derive(Clone)]
struct Sim {
    ledger: Ledger,
    config: SimConfig,
    faults: Arc<Mutex<FaultSwitches>>,
    paused: watch::Sender<bool>,
    refuse: RefuseSwitch,
}

/// Serves the simulator on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    ledger: Ledger,
    config: SimConfig,
    faults: FaultSwitches,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let refuse = RefuseSwitch::default();
    let (paused, _) = watch::channel(faults.pause);
    let sim = Sim { ledger, config, faults: Arc::new(Mutex::new(faults)), paused, refuse: refuse.clone() };
    let app = Router::new()
        .route("/v1/notifications", post(notify))
        .route("/v1/notifications/{key}", get(key_status))
        .route("/effects", get(effects))
        .route("/effects/by-key", get(effects_by_key))
        .route("/effects/ambiguous", get(ambiguous))
        .route("/requests/{key}", get(key_requests))
        .route("/faults", post(set_faults))
        // As a traced provider would: each call continues the caller's trace.
        .layer(axum::middleware::from_fn(herald_api::trace::request_span))
        .with_state(sim);
    let listener = RefusableListener::new(listener, refuse)?;
    info!(addr = %axum::serve::Listener::local_addr(&listener)?, "provider simulator listening");
    axum::serve(listener, app.into_make_service_with_connect_info::<ConnCut>())
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

fn now_ms() -> i64 {
    herald_store::now_ms()
}

async fn notify(State(sim): State<Sim>, ConnectInfo(conn): ConnectInfo<ConnCut>, headers: HeaderMap, body: Bytes) -> Response {
    // The caller's clock started earlier still; from here is the most the
    // simulator can see of it.
    let arrived = Instant::now();
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let (answer, answered) = oneshot::channel();
    // A provider finishes what it started even when the caller hangs up, so
    // the request is served in its own task, not in this handler, which
    // hyper drops when the caller goes; that also keeps its record intact.
    tokio::spawn(serve_call(sim, Call { key, body, arrived, conn }, answer).in_current_span());
    answered.await.unwrap_or_else(|_| (StatusCode::SERVICE_UNAVAILABLE, "the call failed inside the simulator").into_response())
}

/// One request, as it arrived.
struct Call {
    key: Option<String>,
    body: Bytes,
    arrived: Instant,
    conn: ConnCut,
}

/// One call: record, wait, execute, wait, answer — then record in the ledger
/// whether the answer was handed over in time, whatever it says. Recorded
/// first, marked last: a simulator killed anywhere in between leaves the
/// request ambiguous, as its caller saw it; over-counting is the safe side.
async fn serve_call(sim: Sim, call: Call, mut answer: oneshot::Sender<Response>) {
    let Call { key, body, arrived, conn } = call;
    let request = match sim.ledger.record_request(key.as_deref(), now_ms()).await {
        Ok(request) => request,
        Err(e) => {
            let _ = answer.send((StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response());
            return;
        }
    };
    let mut paused = sim.paused.subscribe();
    tokio::select! {
        biased;
        () = async { drop(paused.wait_for(|p| !*p).await) } => {}
        // A held request nobody waits for any more is never executed.
        () = answer.closed() => {
            warn_unrecorded(request, sim.ledger.ambiguous(request, Ambiguity::CallerGone.as_str()).await);
            return;
        }
    }
    let plan = sim.config.slow.map_or(Plan::PROMPT, |s| s.plan(rand::random(), rand::random(), rand::random()));
    tokio::time::sleep(plan.before).await;
    let (response, ran) = execute(&sim, request, key.as_deref(), &body).await;
    tokio::time::sleep(plan.after).await;
    // The cut stands for an answer lost after the work was done.
    let ambiguity = if ran && plan.drop_connection {
        conn.cut();
        Some(Ambiguity::Dropped)
    } else if sim.config.slow.is_some_and(|s| s.late(arrived.elapsed())) {
        Some(Ambiguity::Late)
    } else {
        None
    };
    let delivered = answer.send(response).is_ok();
    let recorded = match (ambiguity, delivered) {
        (None, true) => sim.ledger.answered(request).await,
        (Some(kind), _) => sim.ledger.ambiguous(request, kind.as_str()).await,
        (None, false) => sim.ledger.ambiguous(request, Ambiguity::CallerGone.as_str()).await,
    };
    warn_unrecorded(request, recorded);
}

fn warn_unrecorded(request: i64, recorded: Result<(), sqlx::Error>) {
    if let Err(e) = recorded {
        tracing::warn!(error = %e, request, "ledger: could not record how the request was answered; it counts as ambiguous");
    }
}

/// Applies the request to the ledger; whether it executed or replayed a key.
async fn execute(sim: &Sim, request: i64, key: Option<&str>, body: &[u8]) -> (Response, bool) {
    let Ok(body) = std::str::from_utf8(body) else {
        return ((StatusCode::BAD_REQUEST, "body must be UTF-8").into_response(), false);
    };
    let keyed_since = match sim.config.mode {
        Mode::Keyed => Some(now_ms() - i64::try_from(sim.config.key_retention.as_millis()).unwrap_or(i64::MAX)),
        Mode::Unkeyed => None,
    };
    match sim.ledger.apply(key, body, keyed_since, now_ms()).await {
        Err(e) => ((StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(), false),
        Ok(Applied::Conflict) => {
            ((StatusCode::CONFLICT, "key already used with another body; the earlier effect stands").into_response(), false)
        }
        Ok(Applied::Replayed { receipt }) => (Json(json!({"receipt": receipt, "replayed": true})).into_response(), true),
        Ok(Applied::Executed { receipt }) => {
            after_commit(sim, request).await;
            (Json(json!({"receipt": receipt, "replayed": false})).into_response(), true)
        }
    }
}

/// The fault windows that open after an effect committed.
async fn after_commit(sim: &Sim, request: i64) {
    let mut faults = sim.faults.lock().await;
    if faults.exit_after_commit {
        info!("fault: exiting after commit");
        std::process::exit(86);
    }
    if faults.drop_responses > 0 {
        faults.drop_responses -= 1;
        drop(faults);
        info!("fault: dropping the response after commit");
        let _ = sim.ledger.ambiguous(request, Ambiguity::Dropped.as_str()).await;
        std::future::pending::<()>().await;
    }
}

async fn key_status(State(sim): State<Sim>, Path(key): Path<String>) -> Response {
    if sim.config.mode == Mode::Unkeyed {
        return (StatusCode::NOT_IMPLEMENTED, "unkeyed receiver cannot answer for keys").into_response();
    }
    let since = now_ms() - i64::try_from(sim.config.key_retention.as_millis()).unwrap_or(i64::MAX);
    match sim.ledger.receipt_of(&key, since).await {
        Ok(Some(receipt)) => Json(json!({"receipt": receipt})).into_response(),
        Ok(None) => StatusCode::NOT_FOUND.into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

async fn effects(State(sim): State<Sim>) -> Response {
    match sim.ledger.totals().await {
        Ok(totals) => Json(totals).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

async fn ambiguous(State(sim): State<Sim>) -> Response {
    match sim.ledger.ambiguous_by_kind().await {
        Ok(kinds) => Json(kinds).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

async fn key_requests(State(sim): State<Sim>, Path(key): Path<String>) -> Response {
    match sim.ledger.key_requests(&key).await {
        Ok(counts) => Json(counts).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

async fn effects_by_key(State(sim): State<Sim>) -> Response {
    match sim.ledger.effects_by_key().await {
        Ok(rows) => Json(rows).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

async fn set_faults(State(sim): State<Sim>, body: Bytes) -> Response {
    let switches: FaultSwitches = match serde_json::from_slice(&body) {
        Ok(s) => s,
        Err(e) => return (StatusCode::UNPROCESSABLE_ENTITY, e.to_string()).into_response(),
    };
    sim.paused.send_replace(switches.pause);
    if switches.refuse_for_ms > 0 {
        sim.refuse.refuse_for(Duration::from_millis(switches.refuse_for_ms));
    }
    *sim.faults.lock().await = switches;
    StatusCode::NO_CONTENT.into_response()
}
