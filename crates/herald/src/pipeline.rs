//! All roles of Herald wired together in one process. Each role is a task
//! that takes the shared shutdown token and drains before it returns.

use std::path::PathBuf;

use anyhow::Context;
use herald_api::{AppState, Tokens};
use herald_consumer::{Metrics, Options, Subscription};
use herald_export::artifact::ArtifactStore;
use herald_export::worker::{self, ExportWorker};
use herald_kafka::Topics;
use herald_relay::{Relay, RelayConfig};
use herald_store::Db;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::error;

use crate::subscriptions;

/// What every role needs to reach.
#[derive(Clone)]
pub struct Wiring {
    pub db: Db,
    pub brokers: String,
    pub topics: Topics,
    /// Consumer groups are `<group_prefix>.<subscription>`.
    pub group_prefix: String,
    pub artifacts_dir: PathBuf,
    pub tokens: Tokens,
}

/// Roles running in this process.
pub struct Running {
    pub api_addr: std::net::SocketAddr,
    pub shutdown: CancellationToken,
    tasks: JoinSet<anyhow::Result<()>>,
}

impl Running {
    /// Signals every role to stop and waits for each to drain.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        let mut first_error = None;
        while let Some(joined) = self.tasks.join_next().await {
            if let Err(e) = joined.context("role panicked").and_then(|r| r) {
                error!(error = %e, "role failed");
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Waits until a role fails or `shutdown` is cancelled from outside.
    pub async fn until_stopped(mut self) -> anyhow::Result<()> {
        tokio::select! {
            _ = self.shutdown.cancelled() => {}
            Some(joined) = self.tasks.join_next() => {
                joined.context("role panicked")??;
            }
        }
        self.stop().await
    }
}

/// Starts API, relay, export worker and the search, stats and notify
/// subscriptions.
pub async fn start(wiring: Wiring, listen: &str) -> anyhow::Result<Running> {
    let shutdown = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let listener = TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let api_addr = listener.local_addr()?;
    let state = AppState { db: wiring.db.clone(), topics: wiring.topics.clone(), tokens: wiring.tokens.clone() };
    tasks.spawn(api(listener, state, shutdown.clone()));
    tasks.spawn(relay(wiring.clone(), shutdown.clone()));
    tasks.spawn(export_worker(wiring.clone(), shutdown.clone()));
    for name in subscriptions::Name::ALL {
        tasks.spawn(subscription(name, wiring.clone(), shutdown.clone()));
    }
    Ok(Running { api_addr, shutdown, tasks })
}

async fn api(listener: TcpListener, state: AppState, shutdown: CancellationToken) -> anyhow::Result<()> {
    herald_api::serve(listener, state, shutdown).await.context("http server")
}

async fn relay(wiring: Wiring, shutdown: CancellationToken) -> anyhow::Result<()> {
    let relay = Relay::new(wiring.db, &wiring.brokers, RelayConfig::default())?;
    relay.run(shutdown).await;
    Ok(())
}

async fn export_worker(wiring: Wiring, shutdown: CancellationToken) -> anyhow::Result<()> {
    let artifacts = ArtifactStore::local(&wiring.artifacts_dir)?;
    let subscription = Subscription::new(worker::SUBSCRIPTION, &wiring.group_prefix, &wiring.brokers, &[&wiring.topics.commands]);
    let worker = ExportWorker::new(wiring.db, wiring.topics, artifacts);
    herald_consumer::run(&subscription, &worker, shutdown).await?;
    Ok(())
}

/// One subscription of the events topic; each is its own consumer group, so
/// a slow or stopped one holds none of the others back.
async fn subscription(name: subscriptions::Name, wiring: Wiring, shutdown: CancellationToken) -> anyhow::Result<()> {
    let sub = name.subscription(&wiring.group_prefix, &wiring.brokers, &wiring.topics.events);
    subscriptions::run(name, &wiring.db, &sub, &Options::default(), &Metrics::default(), shutdown).await?;
    Ok(())
}
