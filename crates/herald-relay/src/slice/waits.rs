//! How a slice waits: for the last progress write before it rests, for
//! a NOTIFY or an announcement, for a failed row's backoff.

use std::time::Duration;

use herald_store::outbox::OutboxRow;
use herald_store::{Backend, now_ms};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{End, Next, Recorded, Worker};
use crate::RelayCounters;

impl Worker {
    /// Nothing to read and nothing out: the last progress write lands (a
    /// failed one means reading again at once), then the slice waits.
    pub(super) async fn rest(&mut self, stop: &CancellationToken) -> Next {
        match self.recorded().await {
            Recorded::Lost => return Next::End(End::Lost),
            Recorded::Failed => return Next::Fill,
            Recorded::Yes => {}
        }
        self.idle_wait(stop).await;
        Next::Fill
    }

    /// Nothing to read: wait for a NOTIFY (PostgreSQL) or poll with backoff.
    async fn idle_wait(&mut self, stop: &CancellationToken) {
        RelayCounters::add(&self.shared.counters.idle, 1);
        let config = &self.shared.config;
        let wait = match self.shared.db.backend() {
            Backend::Postgres => config.idle_max,
            Backend::Sqlite => {
                let wait = self.idle;
                self.idle = (self.idle * 2).min(config.idle_max);
                wait
            }
        };
        self.pause(stop, wait, true).await;
    }

    pub(super) async fn pause(&mut self, stop: &CancellationToken, wait: Duration, wakeable: bool) {
        let woken = async {
            if wakeable {
                announced(&mut self.wake).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = woken => {}
        }
    }
}

/// Resolves when rows of the slice were announced since the last read; never
/// once the relay stopped announcing.
pub(super) async fn announced(wake: &mut watch::Receiver<u64>) {
    if wake.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Time left before the head row may be retried.
pub(super) fn backoff_left(head: &OutboxRow) -> Option<Duration> {
    let left = head.next_attempt_at_ms? - now_ms();
    (left > 0).then(|| Duration::from_millis(left as u64))
}
