//! For processes that run for long (`herald serve`): refreshes the figures
//! every `interval` (taken by one process for all, [`crate::shared`]), keeps
//! the last `history` samples for the dashboard's plots, and keeps the
//! Prometheus registry of `GET /metrics` current.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use herald_store::Db;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::figures::{Sample, Status};
use crate::prometheus::{CounterSource, Registry};
use crate::queries::{self, Finished};
use crate::shared::{self, Taken};
use crate::{KafkaProbe, StatusError};

#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// Subscriptions whose figures are shown (`search`, `stats`, `notify`).
    pub subscriptions: Vec<String>,
    pub interval: Duration,
    /// Samples kept for the plots: `history × interval` of the past.
    pub history: usize,
}

impl MonitorConfig {
    /// Every second, the last five minutes.
    pub fn new(subscriptions: &[&str]) -> MonitorConfig {
        MonitorConfig {
            subscriptions: subscriptions.iter().map(|s| (*s).to_owned()).collect(),
            interval: Duration::from_secs(1),
            history: 300,
        }
    }
}

pub struct Monitor {
    db: Db,
    /// This monitor's name on the snapshot lease.
    me: String,
    /// Refreshes whose figures this process took itself.
    taken_here: AtomicU64,
    probe: Option<KafkaProbe>,
    config: MonitorConfig,
    registry: Registry,
    counters: Mutex<Vec<CounterSource>>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    latest: Option<Status>,
    history: VecDeque<Sample>,
    last_error: Option<String>,
    feed: LatencyFeed,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves figures that are merely stale.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Monitor {
    pub fn new(db: Db, probe: Option<KafkaProbe>, config: MonitorConfig) -> Result<Arc<Monitor>, StatusError> {
        let me = format!("monitor-{}", uuid::Uuid::new_v4().simple());
        Ok(Arc::new(Monitor {
            db,
            me,
            taken_here: AtomicU64::new(0),
            probe,
            config,
            registry: Registry::new()?,
            counters: Mutex::default(),
            state: Mutex::default(),
        }))
    }

    /// How many refreshes took the figures here rather than reading another
    /// process's snapshot.
    pub fn refreshes_taken(&self) -> u64 {
        self.taken_here.load(Ordering::Relaxed)
    }

    /// Publishes a counter the runtime keeps as `name{labels}`, read at every refresh.
    pub fn register_counter(&self, name: &'static str, labels: &[(&'static str, &str)], read: impl Fn() -> u64 + Send + Sync + 'static) {
        let labels = labels.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        lock(&self.counters).push(CounterSource { name, labels, read: Box::new(read) });
    }

    /// Takes the figures once and records them.
    pub async fn refresh(&self) -> Result<(), StatusError> {
        let names: Vec<&str> = self.config.subscriptions.iter().map(String::as_str).collect();
        let result = async {
            let take = crate::collect(&self.db, self.probe.as_ref(), &names);
            let (status, taken) = shared::figures(&self.db, &self.me, self.config.interval, take).await?;
            if taken == Taken::Here {
                self.taken_here.fetch_add(1, Ordering::Relaxed);
            }
            let since = lock(&self.state).feed.since();
            let finished = queries::finished_since(&self.db, since).await?;
            Ok::<_, StatusError>((status, finished))
        }
        .await;
        let (status, finished) = match result {
            Ok(figures) => figures,
            Err(e) => {
                self.registry.refresh_failed();
                lock(&self.state).last_error = Some(e.to_string());
                return Err(e);
            }
        };
        let mut state = lock(&self.state);
        let latencies = state.feed.take(finished);
        self.registry.record(&status, &latencies, &lock(&self.counters));
        // A snapshot read again (another process has not taken the next one
        // yet) is not a new sample.
        if state.latest.as_ref().is_none_or(|latest| latest.at_ms != status.at_ms) {
            let previous = state.history.back().zip(state.latest.as_ref().and_then(Status::records_appended)).map(|(s, n)| (s.at_ms, n));
            state.history.push_back(Sample::of(&status, previous));
        }
        while state.history.len() > self.config.history {
            state.history.pop_front();
        }
        state.latest = Some(status);
        state.last_error = None;
        Ok(())
    }

    /// Refreshes every `interval` until `shutdown`. A failed refresh is
    /// logged and shown (`error` in `/status.json`); the next one retries.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {
                    if let Err(e) = self.refresh().await {
                        warn!(error = %e, "status refresh failed");
                    }
                }
            }
        }
    }

    /// `{"status": …, "history": [...], "error": …}` for the dashboard.
    pub fn json(&self) -> Value {
        let state = lock(&self.state);
        json!({
            "status": state.latest,
            "history": state.history,
            "error": state.last_error,
            "interval_ms": self.config.interval.as_millis() as u64,
        })
    }

    /// The Prometheus text exposition of the latest figures.
    pub fn prometheus(&self) -> String {
        self.registry.render()
    }
}

/// Which finished jobs the histogram has seen. Completion timestamps come
/// from the writers' clocks and a transaction can commit a little after its
/// timestamp, so each read looks back `OVERLAP_MS` behind the newest time
/// seen and skips the ids it already counted: each job is observed once.
#[derive(Debug, Default)]
struct LatencyFeed {
    newest_ms: Option<i64>,
    seen: HashMap<String, i64>,
}

const OVERLAP_MS: i64 = 10_000;

impl LatencyFeed {
    /// Jobs that finished before the monitor started are not observations
    /// of this process: the first read starts now.
    fn since(&mut self) -> i64 {
        *self.newest_ms.get_or_insert_with(herald_store::now_ms) - OVERLAP_MS
    }

    /// Latencies of the jobs not seen before.
    fn take(&mut self, finished: Vec<Finished>) -> Vec<i64> {
        let mut out = Vec::new();
        for f in finished {
            self.newest_ms = Some(self.newest_ms.map_or(f.done_ms, |n| n.max(f.done_ms)));
            if self.seen.insert(f.job_id, f.done_ms).is_none() {
                out.push(f.latency_ms);
            }
        }
        let horizon = self.newest_ms.unwrap_or(0) - 2 * OVERLAP_MS;
        self.seen.retain(|_, done| *done >= horizon);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(id: &str, done: i64, latency: i64) -> Finished {
        Finished { job_id: id.into(), done_ms: done, latency_ms: latency }
    }

    #[test]
    fn each_finished_job_is_observed_once_across_overlapping_reads() {
        let mut feed = LatencyFeed { newest_ms: Some(100_000), ..LatencyFeed::default() };
        assert_eq!(feed.since(), 90_000);
        assert_eq!(feed.take(vec![f("a", 100_500, 10), f("b", 101_000, 20)]), vec![10, 20]);
        assert_eq!(feed.since(), 91_000);
        // `a` and `b` again (inside the overlap), `c` committed late with an older timestamp.
        assert_eq!(feed.take(vec![f("a", 100_500, 10), f("c", 100_900, 30), f("b", 101_000, 20)]), vec![30]);
    }
}
