//! Retention floors: how long the rows that recognise a redelivered record
//! must stay.
//!
//! An inbox row is what makes a second delivery of a record harmless, and a
//! second delivery can come as long as the broker keeps the record (a
//! consumer rewound, a group reset, a partition reassigned before its commit)
//! and then for as long as a redrive may still replay it. Removing the row
//! earlier turns that delivery into a second effect. So a retention shorter
//! than the topic's retention plus a redrive window is refused unless the
//! operator says `--force`, and the refusal names both figures. The topic's
//! retention is read from the broker, never assumed.

use std::time::Duration;

use herald_kafka::KafkaConfig;
use herald_status::TopicConfigs;

/// Default of `--redrive-window-days`: how long after the broker dropped a
/// record a redrive (of a dead letter, of parked records, a rewound group)
/// may still deliver it again.
pub const DEFAULT_REDRIVE_WINDOW_DAYS: u32 = 7;

/// How long reading a topic's configs may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a topic keeps its records, as the broker says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicRetention {
    Kept(Duration),
    /// `retention.ms = -1`.
    Forever,
    /// Why it could not be read.
    Unknown(String),
}

impl TopicRetention {
    pub fn from_configs(configs: &TopicConfigs) -> TopicRetention {
        match configs.retention_ms {
            Some(ms) if ms < 0 => TopicRetention::Forever,
            Some(ms) => TopicRetention::Kept(Duration::from_millis(ms.unsigned_abs())),
            None => TopicRetention::Unknown("the broker did not give retention.ms".to_owned()),
        }
    }

    /// The retention of `topic` on the cluster `kafka` (none: not given).
    pub async fn read(kafka: Option<&KafkaConfig>, topic: &str) -> TopicRetention {
        let Some(kafka) = kafka else {
            return TopicRetention::Unknown("no --kafka given to read it from".to_owned());
        };
        match herald_status::topic_configs(kafka, topic, READ_TIMEOUT).await {
            Ok(configs) => TopicRetention::from_configs(&configs),
            Err(why) => TopicRetention::Unknown(why),
        }
    }
}

/// A retention refused: the message names the floor's parts and `--force`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BelowFloor(pub String);

/// Whether `what` (rows such as "inbox rows") may be removed once older than
/// `requested`, given how long `topic` keeps records and the redrive window.
pub fn check(what: &str, requested: Duration, topic: &str, retention: &TopicRetention, redrive_window: Duration) -> Result<(), BelowFloor> {
    let refuse = |why: String| Err(BelowFloor(format!("refusing to remove {what} older than {}: {why}", days(requested))));
    match retention {
        TopicRetention::Kept(kept) => {
            let floor = *kept + redrive_window;
            if requested >= floor {
                return Ok(());
            }
            refuse(format!(
                "topic {topic} keeps records for {} (retention.ms, read from the broker) and a redrive may deliver them again \
                 for {} more (--redrive-window-days), so a duplicate can arrive for {}; ask for at least that, or pass --force \
                 to accept a second effect of a record redelivered later",
                days(*kept),
                days(redrive_window),
                days(floor)
            ))
        }
        TopicRetention::Forever => refuse(format!(
            "topic {topic} keeps records for ever (retention.ms = -1), so a duplicate can arrive at any time; \
             pass --force to accept a second effect of a record redelivered later"
        )),
        TopicRetention::Unknown(why) => {
            refuse(format!("cannot tell how long topic {topic} keeps records ({why}); give --kafka so it can be read, or pass --force"))
        }
    }
}

/// A duration as days (or hours, below a day), for messages.
fn days(d: Duration) -> String {
    let hours = d.as_secs_f64() / 3600.0;
    match hours {
        h if h >= 24.0 && (h % 24.0).abs() < f64::EPSILON => format!("{} day(s)", h / 24.0),
        h if h >= 24.0 => format!("{:.1} days", h / 24.0),
        h => format!("{h:.1} hours"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn a_retention_at_or_above_topic_retention_plus_window_passes() {
        let week = TopicRetention::Kept(7 * DAY);
        assert!(check("inbox rows", 14 * DAY, "t", &week, 7 * DAY).is_ok());
        assert!(check("inbox rows", 30 * DAY, "t", &week, 7 * DAY).is_ok());
    }

    #[test]
    fn a_shorter_one_is_refused_naming_both_figures_and_force() {
        let refusal = check("inbox rows", DAY, "herald.export.events", &TopicRetention::Kept(7 * DAY), 7 * DAY).unwrap_err().0;
        for part in ["herald.export.events", "7 day(s)", "14 day(s)", "--force", "--redrive-window-days"] {
            assert!(refusal.contains(part), "{part} in {refusal}");
        }
    }

    #[test]
    fn for_ever_and_unknown_retentions_refuse_any_age() {
        for retention in [TopicRetention::Forever, TopicRetention::Unknown("mock cluster".into())] {
            let refusal = check("inbox rows", 10_000 * DAY, "t", &retention, DAY).unwrap_err().0;
            assert!(refusal.contains("--force"), "{refusal}");
        }
    }

    #[test]
    fn configs_map_to_retentions() {
        let of = |ms: Option<i64>| TopicRetention::from_configs(&TopicConfigs { retention_ms: ms, ..TopicConfigs::default() });
        assert_eq!(of(Some(-1)), TopicRetention::Forever);
        assert_eq!(of(Some(3_600_000)), TopicRetention::Kept(Duration::from_secs(3600)));
        assert!(matches!(of(None), TopicRetention::Unknown(_)));
    }
}
