//! Waking idle slices when rows commit: PostgreSQL `LISTEN herald_outbox`
//! (the outbox's insert trigger notifies at commit, one notification per
//! slice written, the slice as payload — migration 0019). Only that slice's
//! task wakes; a notification without a slice (the trigger of an older
//! schema) wakes them all. SQLite has no NOTIFY: there the slices wake on
//! the news of commits in this process (`herald_store::appended`). The
//! polling in `slice.rs` stays as the fallback for lost notifications and
//! for SQLite rows written by other processes.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use herald_store::{Backend, Db};
use sqlx::postgres::PgListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::RelayCounters;
use crate::claims::SLICES;

pub const CHANNEL: &str = "herald_outbox";

/// One wake-up channel per slice.
pub(crate) struct Wake(Vec<watch::Sender<u64>>);

impl Wake {
    pub fn new() -> Wake {
        Wake((0..SLICES).map(|_| watch::channel(0).0).collect())
    }

    pub fn subscribe(&self, slice: i32) -> watch::Receiver<u64> {
        self.0[usize::try_from(slice).unwrap_or(0) % self.0.len()].subscribe()
    }

    /// Wakes the slice a notification names, or every slice.
    fn notified(&self, payload: &str) {
        match payload.trim().parse::<i32>() {
            Ok(slice) if (0..SLICES).contains(&slice) => self.slice(slice),
            _ => self.all(),
        }
    }

    fn slice(&self, slice: i32) {
        if let Some(sender) = usize::try_from(slice).ok().and_then(|i| self.0.get(i)) {
            sender.send_modify(|n| *n += 1);
        }
    }

    fn all(&self) {
        for sender in &self.0 {
            sender.send_modify(|n| *n += 1);
        }
    }
}

/// Listens until `stop`, bumping `wake` on every notification. Reconnects
/// after errors, and bumps `wake` then: notifications sent while it was away
/// are lost, so every slice should look once. (Not on the first connection:
/// slices read once when they start anyway.)
pub(crate) async fn listen(db: Db, wake: Arc<Wake>, counters: Arc<RelayCounters>, stop: CancellationToken) {
    if db.backend() != Backend::Postgres {
        return follow_this_process(&db, &wake, &stop).await;
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
                        wake.all();
                    }
                    reconnect = true;
                    loop {
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            received = listener.recv() => match received {
                                Ok(notification) => wake.notified(notification.payload()),
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

/// SQLite: wakes the slices this process's writers announce after their
/// commits (`herald_store::outbox::announce`); rows other processes write
/// wait for the slice's poll.
async fn follow_this_process(db: &Db, wake: &Wake, stop: &CancellationToken) {
    let appended = db.appended();
    let mut news = appended.subscribe();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = news.changed() => if changed.is_err() { return },
        }
        for slice in appended.take() {
            wake.slice(slice);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_wakes_its_slice_or_all_of_them() {
        let wake = Wake::new();
        let mut three = wake.subscribe(3);
        let four = wake.subscribe(4);
        wake.notified("3");
        assert!(three.has_changed().unwrap_or(false) && !four.has_changed().unwrap_or(true));
        three.borrow_and_update();
        wake.notified("");
        assert!(three.has_changed().unwrap_or(false) && four.has_changed().unwrap_or(false), "an older trigger's empty payload wakes all");
        wake.notified("99");
        assert!(four.has_changed().unwrap_or(false));
    }
}
