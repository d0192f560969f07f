//! Where `herald bench latency`'s time went inside Herald: the relay's
//! batches and the search subscription's transactions, averaged per batch,
//! so a slow stage in the per-probe table can be traced to its part.

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use herald_consumer::{Handler, HandlerError, Metrics, Order, Record, WritePath};
use herald_relay::RelayCounters;
use herald_store::Tx;
use serde_json::json;
use sqlx::PgConnection;

use super::probes::{Probes, round1};

/// Where the relay's part went: per batch, on average, the rows it carried
/// and the time its slice spent reading it, awaiting the broker's
/// acknowledgements (`acks=all`) and waiting for the progress write.
pub(super) struct RelayBatches {
    pub(super) batches: u64,
    pub(super) rows: f64,
    pub(super) read_ms: f64,
    pub(super) acks_ms: f64,
    pub(super) record_ms: f64,
}

impl RelayBatches {
    pub(super) fn of(counters: &RelayCounters) -> RelayBatches {
        let batches = RelayCounters::get(&counters.batches);
        let per_batch = |c: &AtomicU64| RelayCounters::get(c) as f64 / batches.max(1) as f64;
        RelayBatches {
            batches,
            rows: per_batch(&counters.sent),
            read_ms: per_batch(&counters.read_us) / 1000.0,
            acks_ms: per_batch(&counters.publish_us) / 1000.0,
            record_ms: per_batch(&counters.record_us) / 1000.0,
        }
    }

    pub(super) fn to_json(&self) -> serde_json::Value {
        json!({ "batches": self.batches, "rows": round1(self.rows), "read_ms": round1(self.read_ms),
                "await_acks_ms": round1(self.acks_ms), "await_progress_write_ms": round1(self.record_ms) })
    }
}

/// Where the subscription's part went, per committed transaction on
/// average: the records it applied and the milliseconds of each stage of
/// [`herald_consumer::StageTimes`] — receiving (from a poll's first record;
/// it overlaps the previous poll's transactions), a lane waiting for its
/// decoding, and the transaction's stages. Lane times are summed over
/// lanes: with two lanes busy they add up to twice the wall time.
pub(super) struct SubscriptionBatches {
    pub(super) batches: u64,
    pub(super) records: f64,
    pub(super) stages_ms: Vec<(&'static str, f64)>,
}

impl SubscriptionBatches {
    pub(super) fn of(metrics: &Metrics) -> SubscriptionBatches {
        let counts = metrics.snapshot();
        let per_batch = |n: u64| n as f64 / counts.batches.max(1) as f64;
        SubscriptionBatches {
            batches: counts.batches,
            records: per_batch(counts.applied),
            stages_ms: metrics.time.snapshot().iter().map(|(stage, us)| (*stage, per_batch(*us) / 1000.0)).collect(),
        }
    }

    pub(super) fn to_json(&self) -> serde_json::Value {
        let stages: serde_json::Map<String, serde_json::Value> =
            self.stages_ms.iter().map(|(stage, ms)| (format!("{stage}_ms"), json!(round1(*ms)))).collect();
        json!({ "batches": self.batches, "records": round1(self.records), "stages": stages })
    }
}

/// The benchmark's handler: the one `herald consume search` runs, noting
/// when each probe is handed to it inside the subscription's transaction.
/// That moment splits "readable → visible" into the subscription's fetch,
/// receive and decoding before it, and the write, commit and reader's next
/// look after it.
pub(super) struct Timed<H> {
    pub(super) inner: H,
    pub(super) probes: Probes,
}

impl<H: Handler> Timed<H> {
    fn note(&self, records: &[Record<'_>]) {
        self.probes.applying(records.iter().map(|r| r.event.key.id.as_str()), Instant::now());
    }
}

impl<H: Handler> Handler for Timed<H> {
    fn handles(&self, event_type: &str) -> bool {
        self.inner.handles(event_type)
    }

    fn order(&self) -> Order {
        self.inner.order()
    }

    async fn apply(&self, tx: &mut Tx<'_>, records: &[Record<'_>]) -> Result<(), HandlerError> {
        self.note(records);
        self.inner.apply(tx, records).await
    }

    fn applies_pg(&self) -> bool {
        self.inner.applies_pg()
    }

    async fn apply_pg(&self, tx: &mut PgConnection, records: &[Record<'_>], path: WritePath) -> Result<(), HandlerError> {
        self.note(records);
        self.inner.apply_pg(tx, records, path).await
    }
}
