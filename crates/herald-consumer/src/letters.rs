//! Setting a record aside: the dead letter both runtimes write (the batching
//! subscriptions and the export worker's one-record loop), and the backoff
//! both use while the database is away.

use std::time::Duration;

use herald_envelope::EventKey;
use herald_store::dead_letter::{self, NewDeadLetter};
use herald_store::{Db, StoreError};
use rdkafka::message::{Headers, Message, OwnedMessage};
use tokio_util::sync::CancellationToken;
use tracing::error;

/// The record whole (key, headers, value, where it was read) with the reason,
/// and its identity when it decoded far enough to have one.
pub(crate) fn letter<'a>(
    subscription: &'a str,
    msg: &'a OwnedMessage,
    identity: Option<(&'a EventKey, &'a str)>,
    reason: &'a str,
    attempts: u32,
) -> NewDeadLetter<'a> {
    NewDeadLetter {
        subscription,
        key: identity.map(|(key, _)| key),
        event_type: identity.map(|(_, event_type)| event_type),
        topic: msg.topic(),
        partition: msg.partition(),
        offset: msg.offset(),
        record_key: msg.key(),
        headers: headers_of(msg),
        value: msg.payload(),
        error: reason,
        attempts: i32::try_from(attempts).unwrap_or(i32::MAX),
    }
}

pub(crate) fn headers_of(msg: &OwnedMessage) -> Vec<(String, Option<Vec<u8>>)> {
    msg.headers().map(|h| h.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect()).unwrap_or_default()
}

/// Stores `letter` in a transaction of its own, retrying until the database
/// takes it: the partition may move past a record only once the record is
/// kept. `on_retry` is told of every failed write (a subscription counts
/// them). `false`: shutdown came first and nothing may be acknowledged.
pub(crate) async fn keep(db: &Db, letter: &NewDeadLetter<'_>, shutdown: &CancellationToken, on_retry: impl Fn()) -> bool {
    let mut backoff = Backoff::new();
    loop {
        let stored = async {
            let mut tx = db.begin().await?;
            dead_letter::insert(&mut tx, letter).await?;
            tx.commit().await?;
            Ok::<(), StoreError>(())
        }
        .await;
        match stored {
            Ok(()) => {
                log_dead(letter);
                return true;
            }
            Err(e) => {
                error!(subscription = letter.subscription, error = %e, "cannot store dead letter; pausing");
                on_retry();
                if !backoff.wait(shutdown).await {
                    return false;
                }
            }
        }
    }
}

pub(crate) fn log_dead(letter: &NewDeadLetter<'_>) {
    error!(
        subscription = letter.subscription,
        topic = letter.topic,
        partition = letter.partition,
        offset = letter.offset,
        attempts = letter.attempts,
        reason = letter.error,
        "record dead-lettered; partition moves on"
    );
}

/// Exponential backoff of retryable failures, cut short by shutdown.
pub(crate) struct Backoff(Duration);

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff(Duration::from_millis(100))
    }

    /// The delay the next [`Backoff::wait`] sleeps.
    pub(crate) fn next(&self) -> Duration {
        self.0
    }

    /// `false` if shutdown came first.
    pub(crate) async fn wait(&mut self, shutdown: &CancellationToken) -> bool {
        let delay = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(10));
        tokio::select! {
            _ = shutdown.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }
}

/// Pause between two tries of a record its processor rejected: a rejection
/// is retried a few times in case it was not as permanent as it said.
pub(crate) fn rejection_pause(rejections: u32) -> Duration {
    Duration::from_millis(20 * u64::from(rejections))
}
