//! Counters of one running subscription, for logs, the CLI summary and tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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
        }
    }
}
