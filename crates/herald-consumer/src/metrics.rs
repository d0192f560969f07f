//! Counters of one running subscription, for logs, the CLI summary and tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[derive(Debug, Default)]
pub struct Metrics {
    /// Events whose effect this process applied (inbox row inserted).
    pub applied: AtomicU64,
    /// Events the inbox had already seen: redeliveries, rewinds, the same fact
    /// in another envelope.
    pub duplicates: AtomicU64,
    /// Events of types the handler does not handle.
    pub skipped: AtomicU64,
    /// Records set aside in the dead-letter table.
    pub dead_lettered: AtomicU64,
    /// Records parked behind a dead letter of their key (per-key order).
    pub parked: AtomicU64,
    /// Transactions committed.
    pub batches: AtomicU64,
    /// Retries after retryable failures (the subscription paused).
    pub retries: AtomicU64,
    /// Partitions this member holds now; written by the rebalance callbacks.
    pub assigned: Arc<AtomicU64>,
    /// Revocations that arrived while lanes were applying and waited for
    /// their offsets to be stored before the partitions were given up.
    pub revocations_deferred: Arc<AtomicU64>,
    /// Where the time goes, in microseconds summed over lanes (the
    /// benchmark prints it per 1,000 events).
    pub time: StageTimes,
}

/// Microseconds spent per stage of the batching runtime.
#[derive(Debug, Default)]
pub struct StageTimes {
    /// Receiving a poll's records from librdkafka (while the lanes apply
    /// the previous poll, except for the first).
    pub receive_us: AtomicU64,
    /// A lane waiting for its next batch's decoding.
    pub decode_wait_us: AtomicU64,
    /// A batch transaction, from `BEGIN` to the commit's answer, in stages
    /// (the snapshot adds them up as `transaction`): `BEGIN` and the
    /// positions' advance (the batch's first statement),
    pub begin_us: AtomicU64,
    /// the inbox rows (and, on the shared path, dead letters and parking),
    pub inbox_us: AtomicU64,
    /// the handler's write,
    pub handler_us: AtomicU64,
    /// the commit.
    pub commit_us: AtomicU64,
}

impl StageTimes {
    /// Adds the time since `since` to `counter` and restarts `since`.
    pub(crate) fn lap(counter: &AtomicU64, since: &mut Instant) {
        let now = Instant::now();
        counter.fetch_add(u64::try_from((now - *since).as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
        *since = now;
    }

    /// Every stage in microseconds, by name.
    pub fn snapshot(&self) -> [(&'static str, u64); 7] {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let stages = [get(&self.begin_us), get(&self.inbox_us), get(&self.handler_us), get(&self.commit_us)];
        [
            ("receive", get(&self.receive_us)),
            ("decode_wait", get(&self.decode_wait_us)),
            ("transaction", stages.iter().sum()),
            ("begin_positions", stages[0]),
            ("inbox", stages[1]),
            ("handler", stages[2]),
            ("commit", stages[3]),
        ]
    }
}

/// A point-in-time copy of [`Metrics`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    pub applied: u64,
    pub duplicates: u64,
    pub skipped: u64,
    pub dead_lettered: u64,
    pub parked: u64,
    pub batches: u64,
    pub retries: u64,
    pub assigned: u64,
    pub revocations_deferred: u64,
}

impl Metrics {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            applied: get(&self.applied),
            duplicates: get(&self.duplicates),
            skipped: get(&self.skipped),
            dead_lettered: get(&self.dead_lettered),
            parked: get(&self.parked),
            batches: get(&self.batches),
            retries: get(&self.retries),
            assigned: get(&self.assigned),
            revocations_deferred: get(&self.revocations_deferred),
        }
    }
}
