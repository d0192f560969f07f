use std::time::Duration;

use herald_fault::Hook;

use crate::Routes;
use crate::claims::SLICES;

#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Rows read, published and recorded per batch of one slice while this
    /// relay holds every slice; see [`RelayConfig::batch_for`].
    pub batch_size: i64,
    /// Batches of one slice sent and not yet recorded at once. With 1 (the
    /// default) a batch is sent only after the previous one's progress
    /// committed, and only read while it commits. With 2 the next batch
    /// goes out while the last one's acknowledgements come back, so a slice
    /// does not stop for a round trip to the brokers per batch: a lone
    /// relay draining a backlog was 11–38 % faster on the mock and 19–36 %
    /// on the three-node cluster. It stays off by default because four
    /// relays sharing an outbox on two cores then drained slower than one
    /// (BENCHMARKS.md, "Two batches out: faster alone, not in company"). A
    /// failure then costs the batch sent behind the failed one: it goes out
    /// again.
    pub in_flight: usize,
    /// Lease length; a relay that neither renews nor records progress for
    /// this long loses its slices to another relay.
    pub lease: Duration,
    /// How often held leases are renewed and slices rebalanced.
    pub renew_every: Duration,
    /// Publishing attempts of a row before it is dead-lettered.
    pub max_attempts: i32,
    /// First retry delay; doubles per attempt up to `backoff_max`, ±50 % jitter.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Longest wait between reads of an idle slice. PostgreSQL wakes relays
    /// with NOTIFY, so this is only the fallback; SQLite polls, starting at
    /// `idle_min` and doubling up to this.
    pub idle_max: Duration,
    pub idle_min: Duration,
    /// How long a stopping relay waits for acknowledgements in flight before
    /// it gives up on recording them (they are published again later).
    pub drain: Duration,
    /// Name of this relay in claims (`claim_owner`); tokens tell restarts apart.
    pub owner: String,
    /// Extra librdkafka producer settings, applied over Herald's (e.g.
    /// `topic.metadata.propagation.max.ms`). The delivery promises
    /// (`enable.idempotence`, `acks`) are not meant to be changed here.
    pub producer: Vec<(String, String)>,
    /// Topics of rows appended without one (the outbox contract).
    pub routes: Routes,
    /// Where consumers resolve Herald's schemas (`GET /schemas/{file}`):
    /// an absolute URL ending in `/` that a record's `dataschema` is put
    /// under instead of `herald:schemas/`.
    pub dataschema_base: Option<String>,
    /// Fault injection (tests): [`herald_fault::Point::BeforeProgress`], with
    /// the slice and the batch's row count, after the broker acknowledged a
    /// batch and before its progress write.
    pub faults: Hook,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            batch_size: 1000,
            in_flight: 1,
            lease: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
            max_attempts: 10,
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            idle_max: Duration::from_millis(500),
            idle_min: Duration::from_millis(10),
            drain: Duration::from_secs(10),
            owner: default_owner(),
            producer: Vec::new(),
            routes: Routes::to(herald_kafka::Topics::default().events.as_str()),
            dataschema_base: None,
            faults: Hook::none(),
        }
    }
}

impl RelayConfig {
    /// A config with `lease` and renewal at a third of it.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self.renew_every = lease / 3;
        self
    }

    /// Rows per batch of a slice while this relay holds `held` slices:
    /// `batch_size` when it holds all of them, proportionally more when it
    /// holds fewer, so that a relay has about `SLICES × batch_size` rows out
    /// whatever its share. Its producer's requests are then as large as one
    /// relay's alone: four relays sending quarter-size requests cost the
    /// brokers 1.7 × the CPU per record, and on shared cores drained slower
    /// than one (BENCHMARKS.md, "Requests as large as one relay's").
    pub fn batch_for(&self, held: usize) -> i64 {
        let slices = i64::from(SLICES);
        let held = i64::try_from(held).unwrap_or(slices).clamp(1, slices);
        self.batch_size.saturating_mul(slices).saturating_add(held - 1) / held
    }

    pub(crate) fn lease_ms(&self) -> i64 {
        i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX)
    }

    /// Delay before attempt `attempts + 1`, with jitter so relays that failed
    /// together do not retry together.
    pub(crate) fn backoff(&self, attempts: i32) -> Duration {
        let exp = self.backoff_base.saturating_mul(1u32 << attempts.clamp(0, 16) as u32);
        exp.min(self.backoff_max).mul_f64(0.5 + fastrand::f64())
    }
}

fn default_owner() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "relay".to_owned());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relay_with_fewer_slices_reads_more_per_slice() {
        let config = RelayConfig { batch_size: 1000, ..RelayConfig::default() };
        assert_eq!(config.batch_for(16), 1000);
        assert_eq!(config.batch_for(8), 2000);
        assert_eq!(config.batch_for(4), 4000);
        assert_eq!(config.batch_for(3), 5334);
        assert_eq!(config.batch_for(1), 16_000);
        // Between a claim and its task's start, or while slices change hands.
        assert_eq!(config.batch_for(0), 16_000);
        assert_eq!(config.batch_for(40), 1000);
    }
}
