//! The figures as Prometheus metrics, through the `metrics` crate.
//!
//! Each monitor records into its own recorder (`with_local_recorder`)
//! instead of the process-global one: a process may run several stacks
//! (tests do), and every figure here is set by the monitor anyway — gauges
//! from the status, counters from the runtime's own atomic counters.

use metrics::{counter, gauge, histogram, with_local_recorder};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::StatusError;
use crate::durability::TopicDurability;
use crate::figures::Status;

pub(crate) const LATENCY_HISTOGRAM: &str = "herald_export_latency_seconds";
/// Upper bounds of the intake-to-terminal histogram, in seconds.
const LATENCY_BUCKETS: [f64; 12] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0];

const JOB_STATUSES: [&str; 4] = ["pending", "running", "succeeded", "failed"];
const INTENT_STATUSES: [&str; 6] = ["pending", "sent", "unknown", "conflict", "failed", "dead"];

/// A counter the runtime keeps (relay, subscriptions), read at each refresh.
pub(crate) struct CounterSource {
    pub name: &'static str,
    pub labels: Vec<(&'static str, String)>,
    pub read: Box<dyn Fn() -> u64 + Send + Sync>,
}

pub(crate) struct Registry {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
}

impl Registry {
    pub fn new() -> Result<Registry, StatusError> {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(LATENCY_HISTOGRAM.into()), &LATENCY_BUCKETS)
            .map_err(|e| StatusError::Recorder(e.to_string()))?
            .build_recorder();
        let handle = recorder.handle();
        Ok(Registry { recorder, handle })
    }

    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// Sets every gauge from `status`, observes newly finished jobs'
    /// latencies, and copies the runtime's counters.
    pub fn record(&self, status: &Status, finished_ms: &[i64], counters: &[CounterSource]) {
        with_local_recorder(&self.recorder, || {
            record_status(status);
            for ms in finished_ms {
                histogram!(LATENCY_HISTOGRAM).record(*ms as f64 / 1000.0);
            }
            for c in counters {
                let labels: Vec<(&'static str, String)> = c.labels.clone();
                counter!(c.name, &labels).absolute((c.read)());
            }
        });
    }

    pub fn refresh_failed(&self) {
        with_local_recorder(&self.recorder, || counter!("herald_status_refresh_errors_total").increment(1));
    }
}

fn secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

fn record_status(s: &Status) {
    let o = &s.outbox;
    for (status, n) in
        [("pending", o.pending), ("retryable_failed", o.retryable_failed), ("failed", o.failed), ("dead_lettered", o.dead_lettered)]
    {
        gauge!("herald_outbox_rows", "status" => status).set(n as f64);
    }
    gauge!("herald_outbox_backlog").set(o.backlog as f64);
    gauge!("herald_outbox_oldest_pending_age_seconds").set(secs(o.oldest_pending_age_ms.unwrap_or(0)));
    gauge!("herald_relay_slices").set(s.relay.slices as f64);
    gauge!("herald_relay_active_claims").set(s.relay.active_claims as f64);
    gauge!("herald_relay_live").set(s.relay.live_relays as f64);
    for sub in &s.subscriptions {
        let name = sub.name.clone();
        if let Some(lag) = sub.lag {
            gauge!("herald_subscription_lag", "subscription" => name.clone()).set(lag as f64);
        }
        gauge!("herald_subscription_inbox_rows", "subscription" => name.clone()).set(sub.inbox_rows as f64);
        gauge!("herald_subscription_dead_letters", "subscription" => name.clone()).set(sub.dead_letters as f64);
        gauge!("herald_subscription_parked_records", "subscription" => name).set(sub.parked_records as f64);
    }
    gauge!("herald_kafka_up").set(if s.kafka.is_some() { 1.0 } else { 0.0 });
    if let Some(kafka) = &s.kafka {
        for (topic, end) in &kafka.end_offsets {
            counter!("herald_kafka_records_total", "topic" => topic.clone()).absolute((*end).max(0) as u64);
        }
        kafka.topics.iter().for_each(record_topic);
    }
    let intents = &s.notifications.by_status;
    for status in INTENT_STATUSES.iter().copied().chain(intents.keys().map(String::as_str)) {
        gauge!("herald_notification_intents", "status" => status.to_owned()).set(intents.get(status).copied().unwrap_or(0) as f64);
    }
    let jobs = &s.jobs;
    for status in JOB_STATUSES.iter().copied().chain(jobs.by_status.keys().map(String::as_str)) {
        gauge!("herald_export_jobs", "status" => status.to_owned()).set(jobs.by_status.get(status).copied().unwrap_or(0) as f64);
    }
    gauge!("herald_export_jobs_oldest_open_age_seconds").set(secs(jobs.oldest_open_age_ms.unwrap_or(0)));
    for (quantile, value) in [("0.5", jobs.latency.p50_ms), ("0.9", jobs.latency.p90_ms), ("0.99", jobs.latency.p99_ms)] {
        if let Some(ms) = value {
            gauge!("herald_export_latency_recent_seconds", "quantile" => quantile).set(secs(ms));
        }
    }
    for g in &s.generations {
        let labels = [("projection", g.projection.clone()), ("generation", g.generation.to_string()), ("state", g.state.clone())];
        gauge!("herald_projection_documents", &labels).set(g.documents as f64);
        if g.active {
            gauge!("herald_projection_active_generation", "projection" => g.projection.clone()).set(g.generation as f64);
        }
    }
}

/// A topic's gauge, left out when the figure is unknown: an absent series
/// is not a made-up value.
fn topic_gauge(name: &'static str, topic: &str, value: Option<f64>) {
    if let Some(v) = value {
        gauge!(name, "topic" => topic.to_owned()).set(v);
    }
}

/// Replication and settings of one topic. Retention is in seconds as
/// Prometheus wants base units; `-1` (kept for ever) stays `-1`, as Kafka
/// says it. `herald_topic_durability_risks` counts the settings that can
/// lose acknowledged events (the reasons are in `herald status`).
fn record_topic(t: &TopicDurability) {
    let topic = t.topic.as_str();
    let retention = t.retention_ms.map(|ms| if ms < 0 { -1.0 } else { secs(ms) });
    let known = t.settings_error.is_none();
    topic_gauge("herald_topic_partitions", topic, Some(t.partitions as f64));
    topic_gauge("herald_topic_replication_factor", topic, t.replication_factor.map(f64::from));
    topic_gauge("herald_topic_min_insync_replicas", topic, t.min_insync_replicas.map(f64::from));
    topic_gauge("herald_topic_retention_seconds", topic, retention);
    topic_gauge("herald_topic_retention_bytes", topic, t.retention_bytes.map(|b| b as f64));
    topic_gauge("herald_topic_unclean_leader_election", topic, t.unclean_leader_election_enable.map(|u| f64::from(u8::from(u))));
    topic_gauge("herald_topic_under_replicated_partitions", topic, Some(t.under_replicated_partitions as f64));
    topic_gauge("herald_topic_leaderless_partitions", topic, Some(t.leaderless_partitions as f64));
    topic_gauge("herald_topic_settings_known", topic, Some(f64::from(u8::from(known))));
    topic_gauge("herald_topic_durability_risks", topic, Some(t.risks.len() as f64));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figures::SubscriptionFigures;

    #[test]
    fn figures_render_as_prometheus_gauges_counters_and_a_histogram() -> Result<(), StatusError> {
        let registry = Registry::new()?;
        let mut s = Status::default();
        s.outbox.backlog = 7;
        s.outbox.oldest_pending_age_ms = Some(2_500);
        s.subscriptions.push(SubscriptionFigures { name: "search".into(), lag: Some(4), inbox_rows: 9, ..SubscriptionFigures::default() });
        s.subscriptions.push(SubscriptionFigures { name: "stats".into(), lag: None, ..SubscriptionFigures::default() });
        s.jobs.by_status.insert("succeeded".into(), 3);
        s.notifications.by_status.insert("unknown".into(), 1);
        let counter = CounterSource { name: "herald_relay_rows_delivered_total", labels: vec![], read: Box::new(|| 12) };
        registry.record(&s, &[200, 3_000], &[counter]);
        let text = registry.render();
        for line in [
            "herald_outbox_backlog 7",
            "herald_outbox_oldest_pending_age_seconds 2.5",
            "herald_subscription_lag{subscription=\"search\"} 4",
            "herald_subscription_inbox_rows{subscription=\"search\"} 9",
            "herald_export_jobs{status=\"succeeded\"} 3",
            "herald_export_jobs{status=\"running\"} 0",
            "herald_notification_intents{status=\"unknown\"} 1",
            "herald_relay_rows_delivered_total 12",
            "herald_export_latency_seconds_bucket{le=\"0.25\"} 1",
            "herald_export_latency_seconds_bucket{le=\"5\"} 2",
            "herald_export_latency_seconds_count 2",
            "# TYPE herald_export_latency_seconds histogram",
        ] {
            assert!(text.lines().any(|l| l == line), "missing `{line}` in:\n{text}");
        }
        // Unknown lag is absent, not a made-up zero.
        assert!(!text.contains("herald_subscription_lag{subscription=\"stats\"}"), "{text}");
        Ok(())
    }

    #[test]
    fn topics_render_their_durability_and_unknown_settings_are_absent() -> Result<(), StatusError> {
        use crate::durability::{PartitionReplicas, TopicConfigs};
        use crate::figures::KafkaFigures;
        let registry = Registry::new()?;
        let p = |replicas, in_sync, leader| PartitionReplicas { replicas, in_sync, leader };
        let configs = TopicConfigs {
            min_insync_replicas: Some(1),
            retention_ms: Some(-1),
            retention_bytes: Some(4096),
            unclean_leader_election_enable: Some(true),
        };
        let s = Status {
            kafka: Some(KafkaFigures {
                topics: vec![
                    TopicDurability::of("events", &[p(3, 2, Some(1)), p(3, 3, None)], Ok(configs)),
                    TopicDurability::of("commands", &[p(1, 1, Some(0))], Err("unsupported".into())),
                ],
                ..KafkaFigures::default()
            }),
            ..Status::default()
        };
        registry.record(&s, &[], &[]);
        let text = registry.render();
        for line in [
            "herald_topic_replication_factor{topic=\"events\"} 3",
            "herald_topic_min_insync_replicas{topic=\"events\"} 1",
            "herald_topic_retention_seconds{topic=\"events\"} -1",
            "herald_topic_retention_bytes{topic=\"events\"} 4096",
            "herald_topic_unclean_leader_election{topic=\"events\"} 1",
            "herald_topic_under_replicated_partitions{topic=\"events\"} 1",
            "herald_topic_leaderless_partitions{topic=\"events\"} 1",
            "herald_topic_durability_risks{topic=\"events\"} 2",
            "herald_topic_replication_factor{topic=\"commands\"} 1",
            "herald_topic_settings_known{topic=\"commands\"} 0",
            "herald_topic_durability_risks{topic=\"commands\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing `{line}` in:\n{text}");
        }
        assert!(!text.contains("herald_topic_min_insync_replicas{topic=\"commands\"}"), "{text}");
        Ok(())
    }
}
