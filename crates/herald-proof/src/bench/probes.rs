//! Timing probes for `herald bench latency`: some of the events appended are
//! probes, and each probe's moments are noted — its transaction committed,
//! its record was readable by a consumer of the topic, the search
//! projection was handed it inside the subscription's transaction, its
//! inbox row (committed with its search document) was visible to a reader.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

/// What is known of one probe.
#[derive(Debug, Clone, Copy, Default)]
struct Moments {
    committed: Option<Instant>,
    on_topic: Option<Instant>,
    applying: Option<Instant>,
    visible: Option<Instant>,
}

/// Every probe of one load, by event id. Shared by the writer, the topic
/// observer and the reader.
#[derive(Clone, Default)]
pub(crate) struct Probes(Arc<Mutex<HashMap<String, Moments>>>);

impl Probes {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Moments>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn committed(&self, ids: &[String], at: Instant) {
        self.with(|m| ids.iter().for_each(|id| m.entry(id.clone()).or_default().committed = Some(at)));
    }

    /// A record was read off the topic: noted if it is a probe's.
    pub fn on_topic(&self, id: &str, at: Instant) {
        self.with(|m| {
            if let Some(p) = m.get_mut(id) {
                p.on_topic.get_or_insert(at);
            }
        });
    }

    /// The projection was handed these events (not yet committed); ids
    /// that are no probe's are ignored.
    pub fn applying<'a>(&self, ids: impl IntoIterator<Item = &'a str>, at: Instant) {
        self.with(|m| {
            for id in ids {
                if let Some(p) = m.get_mut(id) {
                    p.applying.get_or_insert(at);
                }
            }
        });
    }

    pub fn visible(&self, ids: &[String], at: Instant) {
        self.with(|m| {
            for id in ids {
                if let Some(p) = m.get_mut(id) {
                    p.visible.get_or_insert(at);
                }
            }
        });
    }

    /// Up to `limit` committed probes not yet visible, oldest first.
    pub fn outstanding(&self, limit: usize) -> Vec<String> {
        self.with(|m| {
            let mut open: Vec<(Instant, &String)> =
                m.iter().filter(|(_, p)| p.visible.is_none()).filter_map(|(id, p)| p.committed.map(|t| (t, id))).collect();
            open.sort();
            open.into_iter().take(limit).map(|(_, id)| id.clone()).collect()
        })
    }

    pub fn count(&self) -> usize {
        self.with(|m| m.len())
    }

    /// Latencies of every probe, per stage it was seen through.
    pub fn summary(&self) -> Summary {
        let mut s = Summary::default();
        self.with(|m| {
            for p in m.values() {
                let Some(c) = p.committed else { continue };
                if let Some(t) = p.on_topic {
                    s.commit_to_topic.push(t.saturating_duration_since(c));
                    if let Some(v) = p.visible {
                        s.topic_to_visible.push(v.saturating_duration_since(t));
                    }
                    if let Some(a) = p.applying {
                        s.topic_to_applying.push(a.saturating_duration_since(t));
                    }
                }
                if let (Some(a), Some(v)) = (p.applying, p.visible) {
                    s.applying_to_visible.push(v.saturating_duration_since(a));
                }
                if let Some(v) = p.visible {
                    s.end_to_end.push(v.saturating_duration_since(c));
                }
            }
        });
        s
    }
}

/// An offered load: `rate` events/s for `seconds`, what is due counted from
/// the clock rather than from ticks, so a writer that comes back late from
/// a commit takes everything owed since in its next one and the load holds
/// (counting per tick, a writer slower than a tick fell behind for good).
/// About `probes_per_sec` of the events are probes.
pub(crate) struct Pace {
    tick: tokio::time::Interval,
    rate: f64,
    started: Instant,
    seconds: Duration,
    issued: usize,
    probe_every: usize,
}

impl Pace {
    pub fn new(rate: u32, seconds: u64, tick: Duration, probes_per_sec: u32) -> Pace {
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Pace {
            tick: interval,
            rate: f64::from(rate),
            started: Instant::now(),
            seconds: Duration::from_secs(seconds),
            issued: 0,
            probe_every: (rate / probes_per_sec).max(1) as usize,
        }
    }

    /// Events due at the next tick that owes any (never zero); `None` once
    /// the whole load was issued.
    pub async fn due(&mut self) -> Option<usize> {
        while self.issued < self.total() {
            if self.started.elapsed() < self.seconds {
                self.tick.tick().await;
            }
            let owed = self.owed_at(self.started.elapsed());
            if owed > 0 {
                return Some(owed);
            }
        }
        None
    }

    /// Events owed `elapsed` into the load and not issued yet, now counted
    /// as issued.
    fn owed_at(&mut self, elapsed: Duration) -> usize {
        let elapsed = elapsed.min(self.seconds);
        let due = (self.rate * elapsed.as_secs_f64()).floor() as usize;
        let owed = due.saturating_sub(self.issued);
        self.issued += owed;
        owed
    }

    fn total(&self) -> usize {
        (self.rate * self.seconds.as_secs_f64()).floor() as usize
    }

    /// Ids of the probes among events `from, from + 1, …`.
    pub fn probe_ids<'a>(&self, from: usize, ids: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        (from..).zip(ids).filter(|(i, _)| i % self.probe_every == 0).map(|(_, id)| id.to_owned()).collect()
    }
}

/// Latencies of one load.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    pub end_to_end: Vec<Duration>,
    pub commit_to_topic: Vec<Duration>,
    pub topic_to_visible: Vec<Duration>,
    /// Readable on the topic → handed to the projection: the subscription's
    /// fetch, its receive, decoding and the transaction's first statements.
    pub topic_to_applying: Vec<Duration>,
    /// Handed to the projection → visible: the rest of the transaction, its
    /// commit, and the reader's next look.
    pub applying_to_visible: Vec<Duration>,
}

/// p50, p99 and max in milliseconds; zeros when empty.
pub(crate) fn percentiles(samples: &[Duration]) -> [f64; 3] {
    if samples.is_empty() {
        return [0.0; 3];
    }
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
    [at(0.50), at(0.99), ms[ms.len() - 1]]
}

pub(crate) fn stage_json(samples: &[Duration]) -> serde_json::Value {
    let [p50, p99, max] = percentiles(samples);
    json!({ "p50_ms": round1(p50), "p99_ms": round1(p99), "max_ms": round1(max), "samples": samples.len() })
}

pub(crate) fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentiles(&samples), [50.0, 99.0, 100.0]);
        assert_eq!(percentiles(&[Duration::from_millis(7)]), [7.0, 7.0, 7.0]);
        assert_eq!(percentiles(&[]), [0.0; 3]);
    }

    #[tokio::test]
    async fn a_pace_owes_by_the_clock_and_picks_its_probes() {
        let mut pace = Pace::new(10_000, 1, Duration::from_millis(10), 200);
        assert_eq!(pace.owed_at(Duration::from_millis(10)), 100);
        // The writer's commit took 42 ms: its next transaction carries all of
        // them (counted per tick, it carried 100 and fell behind for good).
        assert_eq!(pace.owed_at(Duration::from_millis(52)), 420);
        assert_eq!(pace.owed_at(Duration::from_micros(52_250)), 2, "fractions wait for the next tick");
        assert_eq!(pace.owed_at(Duration::from_secs(3)), 10_000 - 522, "nothing past the load's end");
        assert_eq!(pace.due().await, None, "the whole load was issued");
        let mut slow = Pace::new(10, 1, Duration::from_millis(10), 1);
        assert_eq!(slow.due().await, Some(1), "ticks that owe nothing are skipped, not returned as zero");
        let pace = Pace { probe_every: 2, ..Pace::new(1, 1, Duration::from_millis(10), 1) };
        assert_eq!(pace.probe_ids(4, ["a", "b", "c"]), ["a", "c"]);
    }

    #[test]
    fn a_probe_counts_once_it_was_seen_end_to_end() {
        let probes = Probes::default();
        let t0 = Instant::now();
        probes.committed(&["a".into(), "b".into()], t0);
        probes.on_topic("a", t0 + Duration::from_millis(5));
        probes.on_topic("not-a-probe", t0);
        assert_eq!(probes.outstanding(10).len(), 2);
        probes.visible(&["a".into()], t0 + Duration::from_millis(12));
        assert_eq!(probes.outstanding(10), ["b"]);
        let s = probes.summary();
        assert_eq!((s.end_to_end.len(), s.commit_to_topic.len(), s.topic_to_visible.len()), (1, 1, 1));
        probes.on_topic("b", t0 + Duration::from_millis(3));
        assert_eq!(probes.summary().commit_to_topic.len(), 2, "a stage counts without the next one");
        assert_eq!(s.topic_to_visible[0], Duration::from_millis(7));
        assert!(s.topic_to_applying.is_empty() && s.applying_to_visible.is_empty(), "never handed to the projection");
        probes.applying(["b", "not-a-probe"], t0 + Duration::from_millis(9));
        probes.visible(&["b".into()], t0 + Duration::from_millis(20));
        let s = probes.summary();
        assert_eq!(s.topic_to_applying, [Duration::from_millis(6)]);
        assert_eq!(s.applying_to_visible, [Duration::from_millis(11)]);
        assert_eq!(probes.count(), 2);
    }
}
