//! Counters of one relay process, for the benchmark, tests and logs.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct RelayCounters {
    /// Records handed to the producer (including republishes).
    pub sent: AtomicU64,
    /// Rows whose `delivered` status this relay recorded.
    pub delivered: AtomicU64,
    /// Rows recorded as retryable failures.
    pub retried: AtomicU64,
    /// Rows set aside as `failed` or `dead_lettered`.
    pub set_aside: AtomicU64,
    /// Progress writes refused because the lease was lost.
    pub fenced: AtomicU64,
    /// Batches whose progress was not recorded (store error, lost ack).
    pub unrecorded: AtomicU64,
    /// Batches handed to the producer (including republishes).
    pub batches: AtomicU64,
    /// Batches sent through the producer that lingers (full batches: a
    /// backlog); the others went through the one that sends at once.
    pub backlog_batches: AtomicU64,
    /// Slices claimed.
    pub claims: AtomicU64,
    /// Times a slice found nothing to read and began to wait.
    pub idle: AtomicU64,
    /// 1 while the PostgreSQL `LISTEN` for new rows is active.
    pub listening: AtomicU64,
    /// Time slice tasks spent reading batches, awaiting the broker's
    /// verdicts, and waiting for progress writes (the part of a write not
    /// hidden behind the next read), in microseconds summed over slices:
    /// where a relay's time goes (the benchmark prints the split).
    pub read_us: AtomicU64,
    pub publish_us: AtomicU64,
    pub record_us: AtomicU64,
}

impl RelayCounters {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub(crate) fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn time(counter: &AtomicU64, since: std::time::Instant) {
        counter.fetch_add(since.elapsed().as_micros() as u64, Ordering::Relaxed);
    }
}
