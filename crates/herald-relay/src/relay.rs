//! The relay process: holds its share of slices, renews their leases, and
//! runs one task per held slice (`slice.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use herald_kafka::KafkaConfig;
use herald_store::Db;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

use crate::claims::{self as store, Claim, Reader, SLICES};
use crate::publish::Publisher;
use crate::slice::{self, End};
use crate::{RelayConfig, RelayCounters, RelayError, wake};

/// Longest a relay goes without checking its share of the slices. Shorter
/// than the renewal (a third of the lease): a relay that joins finds the
/// slices it should take given back within about two of these, not two
/// renewals — with a 15 s lease, 2 s instead of 10 s during which the
/// first relay drained almost everything alone (`herald bench scale`).
const BALANCE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Sessions a relay reads its slices through on PostgreSQL, beside the
/// store's pool: half the slices, since a read is one statement and a slice
/// spends most of its time elsewhere (sending, awaiting the broker,
/// recording progress).
const READ_CONNECTIONS: u32 = 8;

/// What every slice task of one relay shares.
pub(crate) struct Shared {
    pub db: Db,
    pub reader: Reader,
    pub publisher: Publisher,
    pub config: RelayConfig,
    pub counters: Arc<RelayCounters>,
    pub wake: Arc<wake::Wake>,
    /// Slices this relay holds and has not been told to give back; what
    /// sizes a slice's batches ([`RelayConfig::batch_for`]).
    pub held: AtomicUsize,
}

impl Shared {
    /// Rows a slice reads next.
    pub(crate) fn batch_size(&self) -> i64 {
        self.config.batch_for(self.held.load(Ordering::Relaxed))
    }
}

pub struct Relay {
    shared: Arc<Shared>,
}

/// A slice this relay holds.
struct Held {
    claim: Claim,
    stop: CancellationToken,
}

/// The slices held and not being given back.
fn active(held: &HashMap<i32, Held>) -> impl Iterator<Item = i32> + '_ {
    held.iter().filter(|(_, h)| !h.stop.is_cancelled()).map(|(slice, _)| *slice)
}

impl Relay {
    pub fn new(db: Db, kafka: &KafkaConfig, config: RelayConfig) -> Result<Relay, RelayError> {
        let publisher = Publisher::new(kafka, &config).map_err(RelayError::Producer)?;
        let reader = Reader::of(&db, READ_CONNECTIONS)?;
        let shared = Shared {
            db,
            reader,
            publisher,
            config,
            counters: Arc::default(),
            wake: Arc::new(wake::Wake::new()),
            held: AtomicUsize::new(0),
        };
        Ok(Relay { shared: Arc::new(shared) })
    }

    /// Counters of this relay.
    pub fn counters(&self) -> Arc<RelayCounters> {
        self.shared.counters.clone()
    }

    /// Relays until `shutdown`, then drains: every slice finishes (or, after
    /// the drain time, abandons) its batch in flight and gives its claim back.
    pub async fn run(&self, shutdown: CancellationToken) {
        let config = &self.shared.config;
        info!(owner = %config.owner, batch = config.batch_size, lease_ms = config.lease_ms(), "relay started");
        let listener = tokio::spawn(
            wake::listen(self.shared.db.clone(), self.shared.wake.clone(), self.shared.counters.clone(), shutdown.child_token())
                .in_current_span(),
        );
        let mut held: HashMap<i32, Held> = HashMap::new();
        let mut tasks: JoinSet<(i32, String, End)> = JoinSet::new();
        let mut renew = tokio::time::interval(config.renew_every);
        let mut balance = tokio::time::interval(config.renew_every.min(BALANCE_EVERY));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = renew.tick() => self.renew(&held).await,
                _ = balance.tick() => self.balance(&mut held, &mut tasks).await,
                Some(joined) = tasks.join_next() => {
                    match joined {
                        Ok((slice, token, end)) => {
                            // Only if it is still this claim: the slice may have been claimed anew.
                            if held.get(&slice).is_some_and(|h| h.claim.token == token) {
                                held.remove(&slice);
                            }
                            if end == End::Lost {
                                warn!(slice, "slice lost to another relay");
                            }
                        }
                        Err(e) => warn!(error = %e, "slice task panicked"),
                    }
                }
            }
            self.shared.held.store(active(&held).count(), Ordering::Relaxed);
        }
        for h in held.values() {
            h.stop.cancel();
        }
        while tasks.join_next().await.is_some() {}
        if let Err(e) = store::leave(&self.shared.db, &config.owner).await {
            warn!(error = %e, "could not leave the relay membership");
        }
        let _ = listener.await;
        let counters = &self.shared.counters;
        // What this process did, for operators and `herald bench scale`.
        info!(delivered = RelayCounters::get(&counters.delivered), sent = RelayCounters::get(&counters.sent), "relay stopped");
    }

    /// Renews held leases and stops slices whose lease is gone.
    async fn renew(&self, held: &HashMap<i32, Held>) {
        let (db, config) = (&self.shared.db, &self.shared.config);
        let claims: Vec<Claim> = held.values().map(|h| h.claim.clone()).collect();
        match store::renew(db, &claims, config.lease_ms()).await {
            Ok(kept) => {
                for h in held.values().filter(|h| !kept.contains(&h.claim.token)) {
                    h.stop.cancel();
                }
            }
            Err(e) => warn!(error = %e, "renewing leases failed"),
        }
    }

    /// Heartbeats, then takes or gives back slices so that each live relay
    /// holds about its share.
    async fn balance(&self, held: &mut HashMap<i32, Held>, tasks: &mut JoinSet<(i32, String, End)>) {
        let (db, config) = (&self.shared.db, &self.shared.config);
        let members = match store::heartbeat(db, &config.owner, config.lease_ms()).await {
            Ok(n) => n,
            Err(e) => {
                warn!(error = %e, "relay heartbeat failed");
                return;
            }
        };
        let share = (i64::from(SLICES) + members - 1) / members;
        let mut mine: Vec<i32> = active(held).collect();
        let active = mine.len() as i64;
        if active > share {
            mine.sort_unstable();
            for slice in mine.iter().rev().take((active - share) as usize) {
                info!(slice, share, "giving a slice back to rebalance");
                held[slice].stop.cancel();
            }
            return;
        }
        match store::claim(db, &config.owner, config.lease_ms(), share - active).await {
            Ok(claims) => {
                // Before the new slices' first reads, which size by it.
                self.shared.held.store(active as usize + claims.len(), Ordering::Relaxed);
                for claim in claims {
                    info!(slice = claim.slice, attempt = claim.attempt_count, "slice claimed");
                    RelayCounters::add(&self.shared.counters.claims, 1);
                    let stop = CancellationToken::new();
                    let fresh = Held { claim: claim.clone(), stop: stop.clone() };
                    if let Some(old) = held.insert(claim.slice, fresh) {
                        // An earlier claim of ours expired and its task still drains.
                        old.stop.cancel();
                    }
                    let (shared, slice, token) = (self.shared.clone(), claim.slice, claim.token.clone());
                    tasks.spawn(async move { (slice, token, slice::run(shared, claim, stop).await) }.in_current_span());
                }
            }
            Err(e) => warn!(error = %e, "claiming slices failed"),
        }
    }
}
