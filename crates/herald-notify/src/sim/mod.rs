//! `herald provider-sim`: a reference notification receiver with a durable
//! ledger, used to prove where duplicates come from. Keyed mode honours
//! `Idempotency-Key` (same key and body replays the stored result; same key,
//! other body answers 409 and keeps the old effect); unkeyed mode executes
//! every request. Fault switches reproduce the windows of seed 003: the
//! answer lost after the commit, the process dying after the commit,
//! connections refused, and calls held until released.

mod ledger;
mod listener;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{Mutex, watch};
use tokio_util::sync::CancellationToken;
use tracing::info;

pub use ledger::{Applied, KeyEffects, Ledger, Totals};
pub use listener::{RefusableListener, RefuseSwitch};

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
pub async fn serve(listener: TcpListener, ledger: Ledger, config: SimConfig, faults: FaultSwitches, shutdown: CancellationToken) -> std::io::Result<()> {
    let refuse = RefuseSwitch::default();
    let (paused, _) = watch::channel(faults.pause);
    let sim = Sim { ledger, config, faults: Arc::new(Mutex::new(faults)), paused, refuse: refuse.clone() };
    let app = Router::new()
        .route("/v1/notifications", post(notify))
        .route("/v1/notifications/{key}", get(key_status))
        .route("/effects", get(effects))
        .route("/effects/by-key", get(effects_by_key))
        .route("/faults", post(set_faults))
        .with_state(sim);
    let listener = RefusableListener::new(listener, refuse)?;
    info!(addr = %axum::serve::Listener::local_addr(&listener)?, "provider simulator listening");
    axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await }).await
}

fn now_ms() -> i64 {
    herald_store::now_ms()
}

async fn notify(State(sim): State<Sim>, headers: HeaderMap, body: Bytes) -> Response {
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let Ok(body) = String::from_utf8(body.to_vec()) else {
        return (StatusCode::BAD_REQUEST, "body must be UTF-8").into_response();
    };
    if let Err(e) = sim.ledger.record_request(key.as_deref(), now_ms()).await {
        return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response();
    }
    let mut paused = sim.paused.subscribe();
    let _ = paused.wait_for(|p| !*p).await;
    let keyed_since = match sim.config.mode {
        Mode::Keyed => Some(now_ms() - i64::try_from(sim.config.key_retention.as_millis()).unwrap_or(i64::MAX)),
        Mode::Unkeyed => None,
    };
    let applied = match sim.ledger.apply(key.as_deref(), &body, keyed_since, now_ms()).await {
        Ok(applied) => applied,
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    };
    match applied {
        Applied::Conflict => (StatusCode::CONFLICT, "key already used with another body; the earlier effect stands").into_response(),
        Applied::Replayed { receipt } => Json(json!({"receipt": receipt, "replayed": true})).into_response(),
        Applied::Executed { receipt } => {
            after_commit(&sim).await;
            Json(json!({"receipt": receipt, "replayed": false})).into_response()
        }
    }
}

/// The fault windows that open after an effect committed.
async fn after_commit(sim: &Sim) {
    let mut faults = sim.faults.lock().await;
    if faults.exit_after_commit {
        info!("fault: exiting after commit");
        std::process::exit(86);
    }
    if faults.drop_responses > 0 {
        faults.drop_responses -= 1;
        drop(faults);
        info!("fault: dropping the response after commit");
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
