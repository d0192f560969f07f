//! A batch's verdicts turned into what its progress write records.

use std::time::Duration;

use herald_store::now_ms;
use herald_store::outbox::{self, OutboxRow};
use tracing::{error, warn};

use crate::claims::Setback;
use crate::{Class, PublishError};

/// A batch's verdicts turned into what to record.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Settled {
    /// Rows acknowledged (the cursor passes them).
    pub delivered: usize,
    /// Delivered rows that had failed before (`retryable_failed`): the
    /// cursor passing them is not enough, their status is rewritten.
    pub recovered: Vec<i64>,
    pub setbacks: Vec<Setback>,
    /// (xid, seq) of the last row the cursor may pass.
    pub last_done: Option<(i64, i64)>,
    /// A retryable failure stopped the batch: rows after it are not recorded
    /// (even if acknowledged) and are published again after the retry.
    pub stopped: bool,
}

/// What a recorded batch adds to the relay's counters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tally {
    pub delivered: usize,
    pub retried: usize,
    pub set_aside: usize,
}

impl Settled {
    pub fn tally(&self) -> Tally {
        let retried = self.setbacks.iter().filter(|s| s.status == outbox::RETRYABLE_FAILED).count();
        Tally { delivered: self.delivered, retried, set_aside: self.setbacks.len() - retried }
    }
}

/// Rows are settled in order. A delivered row is done (the cursor passing it
/// says so); a permanent failure
/// is set aside (`failed`) and passed; a retryable one is retried later —
/// it and everything after it in the slice wait, so a key's later rows never
/// overtake it — unless it used up its attempts (`dead_lettered`, passed).
pub(crate) fn settle(
    rows: &[OutboxRow],
    verdicts: Vec<Result<(), PublishError>>,
    max_attempts: i32,
    backoff: impl Fn(i32) -> Duration,
) -> Settled {
    let mut settled = Settled::default();
    for (i, (row, verdict)) in rows.iter().zip(verdicts.iter()).enumerate() {
        let Err(error) = verdict else {
            settled.delivered += 1;
            if row.attempts > 0 {
                settled.recovered.push(row.seq);
            }
            settled.last_done = Some((row.xid, row.seq));
            continue;
        };
        let attempts = row.attempts + 1;
        let status = match error.class {
            Class::Permanent => outbox::FAILED,
            Class::Retryable if attempts >= max_attempts => outbox::DEAD_LETTERED,
            Class::Retryable => outbox::RETRYABLE_FAILED,
        };
        if status != outbox::RETRYABLE_FAILED {
            error!(seq = row.seq, event_id = %row.event.id, status, %error, "row set aside");
            settled.setbacks.push(Setback { seq: row.seq, status, error: error.message.clone(), next_attempt_at_ms: None });
            settled.last_done = Some((row.xid, row.seq));
            continue;
        }
        let at = now_ms() + backoff(row.attempts).as_millis() as i64;
        warn!(seq = row.seq, event_id = %row.event.id, attempts, %error, "publish failed; will retry");
        warn_if_overtaken(row, &rows[i + 1..], &verdicts[i + 1..]);
        settled.setbacks.push(Setback { seq: row.seq, status, error: error.message.clone(), next_attempt_at_ms: Some(at) });
        settled.stopped = true;
        break;
    }
    settled
}

/// librdkafka may deliver a later record of a partition after an earlier one
/// failed; if that later record has the same key, Kafka already holds the
/// key's records out of order. Nothing can undo that; say so loudly.
fn warn_if_overtaken(failed: &OutboxRow, later: &[OutboxRow], verdicts: &[Result<(), PublishError>]) {
    let key = &failed.event.partition_key;
    if later.iter().zip(verdicts).any(|(r, v)| v.is_ok() && &r.event.partition_key == key) {
        error!(seq = failed.seq, key = %key, "a later record of the same key was acknowledged before this failed one: order broken for this key");
    }
}

#[cfg(test)]
mod tests {
    use herald_envelope::OutboxEvent;

    use super::*;

    fn row(seq: i64, attempts: i32, key: &str) -> OutboxRow {
        let event = OutboxEvent {
            id: format!("e-{seq}"),
            source: "/test".into(),
            event_type: "t".into(),
            subject: key.into(),
            time: Default::default(),
            schema_file: String::new(),
            data: Vec::new(),
            content_type: "application/json".into(),
            extensions: Default::default(),
            topic: "t".into(),
            partition_key: key.into(),
            trace: None,
        };
        OutboxRow { seq, attempts, next_attempt_at_ms: None, xid: 0, event }
    }

    /// Acknowledged rows count as delivered, a refused one is set aside and
    /// passed, a retryable one stops the batch: what comes after it counts
    /// for nothing, even acknowledged.
    #[test]
    fn a_batch_tallies_what_its_progress_write_records() {
        let rows = [row(1, 0, "a"), row(2, 0, "b"), row(3, 2, "c"), row(4, 9, "d"), row(5, 0, "e"), row(6, 0, "f"), row(7, 0, "g")];
        let verdicts = vec![
            Ok(()),
            Err(PublishError::permanent("too large")),
            Ok(()),
            Err(PublishError::retryable("down")),
            Err(PublishError::retryable("down")),
            Ok(()),
            Ok(()),
        ];
        let settled = settle(&rows, verdicts, 10, |_| Duration::from_secs(1));
        assert_eq!(settled.recovered, vec![3]);
        assert_eq!(settled.last_done, Some((0, 4)));
        assert!(settled.stopped);
        let tally = settled.tally();
        assert_eq!((tally.delivered, tally.retried, tally.set_aside), (2, 1, 2));
    }
}
