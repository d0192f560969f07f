//! Waking idle slices when rows commit: PostgreSQL `LISTEN herald_outbox`
//! (the outbox's insert trigger notifies at commit). The polling in
//! `slice.rs` stays as the fallback for lost notifications and for SQLite.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use herald_store::{Backend, Db};
use sqlx::postgres::PgListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::RelayCounters;

pub const CHANNEL: &str = "herald_outbox";

/// Listens until `stop`, bumping `wake` on every notification. Reconnects
/// after errors, and bumps `wake` then: notifications sent while it was away
/// are lost, so every slice should look once. (Not on the first connection:
/// slices read once when they start anyway.)
pub(crate) async fn listen(db: Db, wake: watch::Sender<u64>, counters: Arc<RelayCounters>, stop: CancellationToken) {
    if db.backend() != Backend::Postgres {
        return;
    }
    let mut reconnect = false;
    while !stop.is_cancelled() {
        match PgListener::connect(db.url()).await {
            Ok(mut listener) => {
                if let Err(e) = listener.listen(CHANNEL).await {
                    warn!(error = %e, "LISTEN failed; relying on polling for now");
                } else {
                    debug!("listening for outbox notifications");
                    counters.listening.store(1, Ordering::Relaxed);
                    if reconnect {
                        wake.send_modify(|n| *n += 1);
                    }
                    reconnect = true;
                    loop {
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            received = listener.recv() => match received {
                                Ok(_) => wake.send_modify(|n| *n += 1),
                                Err(e) => {
                                    warn!(error = %e, "notification listener failed; reconnecting");
                                    counters.listening.store(0, Ordering::Relaxed);
                                    break;
                                }
                            }
                        }
                    }
                }
            }
            Err(e) => warn!(error = %e, "cannot connect the notification listener; relying on polling"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
