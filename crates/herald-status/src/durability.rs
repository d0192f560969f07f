//! How durable Herald's topics are, as plain data, and the rule that says
//! which settings can lose an event the producer was told is written.
//!
//! Herald's delivery promise ends at the broker's acknowledgement (`acks=all`,
//! idempotent producer); what the broker does with an acknowledged record
//! afterwards is decided by the topic's replication settings. Nothing here
//! does IO: the broker's answers come in through [`crate::topics`].

use serde::{Deserialize, Serialize};

/// A broker's disk can die; a record must outlive one loss and still have
/// a second copy to re-replicate from.
pub const MIN_SAFE_REPLICATION_FACTOR: i32 = 3;
/// `acks=all` waits only for the in-sync replicas; with fewer than two, one
/// broker's acknowledgement is the whole promise.
pub const MIN_SAFE_MIN_INSYNC: i32 = 2;

pub const REPLICATION_RISK: &str = "a broker's disk loss can lose acknowledged events";
pub const MIN_INSYNC_RISK: &str = "an acks=all write is acknowledged by one replica";
pub const UNCLEAN_RISK: &str = "an out-of-sync replica may become leader and drop acknowledged events";

/// One partition as the cluster metadata describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionReplicas {
    pub replicas: usize,
    pub in_sync: usize,
    /// `None`: no broker leads it, so it takes no writes.
    pub leader: Option<i32>,
}

/// The topic configs DescribeConfigs answered with, typed. A value the
/// broker left out or that does not parse is `None` (unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicConfigs {
    pub min_insync_replicas: Option<i32>,
    /// `-1`: records are kept for ever.
    pub retention_ms: Option<i64>,
    /// `None` also when it is not set (`-1`, the default): only time limits.
    pub retention_bytes: Option<i64>,
    pub unclean_leader_election_enable: Option<bool>,
}

impl TopicConfigs {
    /// From `(name, value)` pairs of a DescribeConfigs answer.
    pub fn from_entries<'a>(entries: impl IntoIterator<Item = (&'a str, Option<&'a str>)>) -> TopicConfigs {
        let mut configs = TopicConfigs::default();
        for (name, value) in entries {
            let Some(value) = value.map(str::trim) else { continue };
            match name {
                "min.insync.replicas" => configs.min_insync_replicas = value.parse().ok(),
                "retention.ms" => configs.retention_ms = value.parse().ok(),
                "retention.bytes" => configs.retention_bytes = value.parse().ok().filter(|b: &i64| *b >= 0),
                "unclean.leader.election.enable" => configs.unclean_leader_election_enable = value.parse().ok(),
                _ => {}
            }
        }
        configs
    }
}

/// A setting of a topic that can lose acknowledged events, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Risk {
    /// The Kafka name of the setting (`replication.factor`, …).
    pub setting: String,
    pub value: String,
    pub reason: String,
}

impl Risk {
    fn new(setting: &str, value: impl ToString, reason: &str) -> Risk {
        Risk { setting: setting.to_owned(), value: value.to_string(), reason: reason.to_owned() }
    }
}

/// The risks of a topic's settings. An unknown setting is no risk here: it
/// is shown as unknown, and guessing would cry wolf on every broker that
/// does not answer DescribeConfigs. Under-replicated partitions are not a
/// risk of the settings either: they are a current degradation, shown apart.
pub fn risks(replication_factor: Option<i32>, configs: &TopicConfigs) -> Vec<Risk> {
    let mut out = Vec::new();
    if let Some(factor) = replication_factor.filter(|f| *f < MIN_SAFE_REPLICATION_FACTOR) {
        out.push(Risk::new("replication.factor", factor, REPLICATION_RISK));
    }
    if let Some(min) = configs.min_insync_replicas.filter(|m| *m < MIN_SAFE_MIN_INSYNC) {
        out.push(Risk::new("min.insync.replicas", min, MIN_INSYNC_RISK));
    }
    if configs.unclean_leader_election_enable == Some(true) {
        out.push(Risk::new("unclean.leader.election.enable", true, UNCLEAN_RISK));
    }
    out
}

/// One of Herald's topics: its replication as the metadata says, its
/// settings as DescribeConfigs says, and what in them can lose events.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicDurability {
    pub topic: String,
    pub partitions: usize,
    /// The smallest replica count of its partitions: a topic is as durable
    /// as its weakest partition. `None` without partitions.
    pub replication_factor: Option<i32>,
    pub min_insync_replicas: Option<i32>,
    pub retention_ms: Option<i64>,
    pub retention_bytes: Option<i64>,
    pub unclean_leader_election_enable: Option<bool>,
    /// Partitions whose in-sync replicas are fewer than their replicas.
    pub under_replicated_partitions: usize,
    /// Partitions no broker leads: writes to them fail until one does.
    pub leaderless_partitions: usize,
    /// Why the settings are unknown (e.g. the mock cluster has no
    /// DescribeConfigs); the replication figures still stand.
    pub settings_error: Option<String>,
    pub risks: Vec<Risk>,
}

impl TopicDurability {
    /// The figures of `topic` from its partitions' metadata and its configs
    /// (or why they could not be read).
    pub fn of(topic: &str, partitions: &[PartitionReplicas], configs: Result<TopicConfigs, String>) -> TopicDurability {
        let replication_factor = partitions.iter().map(|p| i32::try_from(p.replicas).unwrap_or(i32::MAX)).min();
        let (configs, settings_error) = match configs {
            Ok(c) => (c, None),
            Err(e) => (TopicConfigs::default(), Some(e)),
        };
        TopicDurability {
            topic: topic.to_owned(),
            partitions: partitions.len(),
            replication_factor,
            min_insync_replicas: configs.min_insync_replicas,
            retention_ms: configs.retention_ms,
            retention_bytes: configs.retention_bytes,
            unclean_leader_election_enable: configs.unclean_leader_election_enable,
            under_replicated_partitions: partitions.iter().filter(|p| p.in_sync < p.replicas).count(),
            leaderless_partitions: partitions.iter().filter(|p| p.leader.is_none()).count(),
            settings_error,
            risks: risks(replication_factor, &configs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configs(min_insync: i32, unclean: bool) -> TopicConfigs {
        TopicConfigs { min_insync_replicas: Some(min_insync), unclean_leader_election_enable: Some(unclean), ..TopicConfigs::default() }
    }

    fn reasons(risks: &[Risk]) -> Vec<&str> {
        risks.iter().map(|r| r.reason.as_str()).collect()
    }

    #[test]
    fn three_replicas_two_in_sync_clean_elections_risk_nothing() {
        assert_eq!(risks(Some(3), &configs(2, false)), vec![]);
        assert_eq!(risks(Some(5), &configs(3, false)), vec![]);
    }

    #[test]
    fn each_unsafe_setting_is_one_risk_with_its_reason() {
        assert_eq!(risks(Some(2), &configs(2, false)), vec![Risk::new("replication.factor", 2, REPLICATION_RISK)]);
        assert_eq!(risks(Some(3), &configs(1, false)), vec![Risk::new("min.insync.replicas", 1, MIN_INSYNC_RISK)]);
        assert_eq!(risks(Some(3), &configs(2, true)), vec![Risk::new("unclean.leader.election.enable", true, UNCLEAN_RISK)]);
        assert_eq!(reasons(&risks(Some(1), &configs(1, true))), [REPLICATION_RISK, MIN_INSYNC_RISK, UNCLEAN_RISK]);
    }

    #[test]
    fn unknown_settings_are_not_guessed_into_risks() {
        assert_eq!(risks(None, &TopicConfigs::default()), vec![]);
        // The replication factor comes from metadata and is judged alone.
        assert_eq!(reasons(&risks(Some(1), &TopicConfigs::default())), [REPLICATION_RISK]);
    }

    #[test]
    fn configs_are_typed_and_unset_retention_bytes_is_none() {
        let entries = [
            ("min.insync.replicas", Some("2")),
            ("retention.ms", Some("604800000")),
            ("retention.bytes", Some("-1")),
            ("unclean.leader.election.enable", Some("false")),
            ("cleanup.policy", Some("delete")),
        ];
        let c = TopicConfigs::from_entries(entries);
        assert_eq!(
            c,
            TopicConfigs {
                min_insync_replicas: Some(2),
                retention_ms: Some(604_800_000),
                retention_bytes: None,
                unclean_leader_election_enable: Some(false)
            }
        );
        let c = TopicConfigs::from_entries([
            ("retention.bytes", Some("1073741824")),
            ("min.insync.replicas", Some("x")),
            ("retention.ms", None),
        ]);
        assert_eq!((c.retention_bytes, c.min_insync_replicas, c.retention_ms), (Some(1_073_741_824), None, None));
    }

    #[test]
    fn partitions_give_the_weakest_factor_and_the_degraded_counts() {
        let p = |replicas, in_sync, leader| PartitionReplicas { replicas, in_sync, leader };
        let parts = [p(3, 3, Some(1)), p(3, 2, Some(2)), p(2, 1, None)];
        let t = TopicDurability::of("events", &parts, Ok(configs(2, false)));
        assert_eq!((t.partitions, t.replication_factor, t.under_replicated_partitions, t.leaderless_partitions), (3, Some(2), 2, 1));
        assert_eq!(reasons(&t.risks), [REPLICATION_RISK]);
    }

    #[test]
    fn unreadable_configs_leave_settings_unknown_and_say_why() {
        let t = TopicDurability::of("events", &[PartitionReplicas { replicas: 3, in_sync: 3, leader: Some(0) }], Err("unsupported".into()));
        assert_eq!((t.replication_factor, t.min_insync_replicas, t.settings_error.as_deref()), (Some(3), None, Some("unsupported")));
        assert!(t.risks.is_empty());
    }
}
