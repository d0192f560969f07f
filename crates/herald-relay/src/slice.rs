//! One claimed slice: read forward, publish, await every verdict, record
//! progress under the claim's token.
//!
//! A slice never has two batches in flight: the next batch is published only
//! after the previous one's progress was written. So a relay that takes the
//! slice over starts exactly where the unrecorded batch started, and however
//! the two relays' records interleave in Kafka, the first copy of each record
//! of a key comes in order. What overlaps is reading: the next batch is read
//! while the previous batch's progress write commits (one fenced cursor
//! write; on a durable server most of its time is the commit's flush), and
//! thrown away if that write fails. A batch with a retryable failure is
//! recorded before reading on, since the next read includes the failed row
//! and must see its attempts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use herald_fault::{Action, Point};
use herald_store::outbox::{self, OutboxRow};
use herald_store::{Backend, StoreError, now_ms};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, warn};

use crate::claims::{self as store, Claim, Cursor, Fence, Setback};
use crate::publish::Lane;
use crate::relay::Shared;
use crate::{Class, PublishError, RelayCounters};

/// How a slice task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Asked to stop; the claim was given back.
    Released,
    /// A progress write was refused: another relay holds the slice now.
    Lost,
}

pub(crate) async fn run(shared: Arc<Shared>, claim: Claim, stop: CancellationToken) -> End {
    let mut worker = Worker {
        wake: shared.wake.subscribe(claim.slice),
        persisted: claim.cursor.clone(),
        cursor: claim.cursor.clone(),
        idle: shared.config.idle_min,
        recording: None,
        shared,
        claim,
    };
    let end = match worker.work(&stop).await {
        // Its last progress must land before the claim is given back.
        End::Released if worker.recorded().await == Recorded::Lost => End::Lost,
        end => end,
    };
    if end == End::Released {
        if let Err(e) = store::release(&worker.shared.db, &worker.claim).await {
            // The lease then simply expires; another relay waits that long.
            warn!(slice = worker.claim.slice, error = %e, "could not release the claim");
        }
    }
    info!(slice = worker.claim.slice, ?end, "slice stopped");
    end
}

struct Worker {
    shared: Arc<Shared>,
    claim: Claim,
    /// Cursor as last recorded; a batch whose progress was not recorded is
    /// read again from here.
    persisted: Cursor,
    cursor: Cursor,
    wake: watch::Receiver<u64>,
    idle: Duration,
    /// The last batch's progress write, committing while the next batch is
    /// read and sent.
    recording: Option<Recording>,
}

/// A progress write under way.
struct Recording {
    next: Cursor,
    settled: Settled,
    write: JoinHandle<Result<Fence, StoreError>>,
}

/// What became of the progress write under way, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recorded {
    /// Committed (or there was none): the recorded cursor moved on.
    Yes,
    /// Refused: another relay holds the slice now.
    Lost,
    /// Failed: the cursor is back at the last recorded one, and whatever was
    /// sent since goes out again.
    Failed,
}

impl Worker {
    async fn work(&mut self, stop: &CancellationToken) -> End {
        let slice = self.claim.slice;
        while !stop.is_cancelled() {
            self.wake.borrow_and_update();
            let started = Instant::now();
            let rows = match store::read(&self.shared.db, slice, &self.cursor, self.shared.config.batch_size).await {
                Ok((rows, cursor)) => {
                    self.cursor = cursor;
                    rows
                }
                Err(e) => {
                    warn!(slice, error = %e, "reading the outbox failed; retrying");
                    self.pause(stop, self.shared.config.idle_max, false).await;
                    continue;
                }
            };
            RelayCounters::time(&self.shared.counters.read_us, started);
            // Nothing is published, and no wait begins, before the last
            // batch is recorded.
            match self.recorded().await {
                Recorded::Lost => return End::Lost,
                // Read again from the recorded cursor.
                Recorded::Failed => continue,
                Recorded::Yes => {}
            }
            if rows.is_empty() {
                self.cursor = self.cursor.after(None, true);
                self.idle_wait(stop).await;
                continue;
            }
            self.idle = self.shared.config.idle_min;
            if let Some(wait) = backoff_left(&rows[0]) {
                self.pause(stop, wait, false).await;
                continue;
            }
            if let Some(end) = self.batch(rows, stop).await {
                return end;
            }
        }
        End::Released
    }

    /// Publishes one batch and starts its progress write; `Some` ends the slice.
    async fn batch(&mut self, rows: Vec<OutboxRow>, stop: &CancellationToken) -> Option<End> {
        let config = &self.shared.config;
        let step_done = (rows.len() as i64) < config.batch_size;
        let started = Instant::now();
        // A full batch: the slice has a backlog.
        let lane = if step_done { Lane::Live } else { Lane::Backlog };
        if lane == Lane::Backlog {
            RelayCounters::add(&self.shared.counters.backlog_batches, 1);
        }
        let Some(verdicts) = self.publish(&rows, lane, stop).await else {
            // Stopping with acknowledgements outstanding: record nothing.
            RelayCounters::add(&self.shared.counters.unrecorded, 1);
            return Some(End::Released);
        };
        RelayCounters::time(&self.shared.counters.publish_us, started);
        self.shared.publisher.check_fatal(&verdicts, lane);
        let settled = settle(&rows, verdicts, config.max_attempts, |a| config.backoff(a));
        let next = self.cursor.after(settled.last_done, step_done && !settled.stopped);
        let rows_n = i64::try_from(rows.len()).unwrap_or(i64::MAX);
        if let Action::LoseAck | Action::Fail(_) = config.faults.at(Point::BeforeProgress, &self.claim.slice.to_string(), rows_n).await {
            warn!(slice = self.claim.slice, "fault: acknowledgement lost before progress was recorded");
            self.unrecorded();
            return None;
        }
        let stopped = settled.stopped;
        let (db, claim, cursor, ttl) = (self.shared.db.clone(), self.claim.clone(), next.clone(), config.lease_ms());
        let (recovered, setbacks) = (settled.recovered.clone(), settled.setbacks.clone());
        let write =
            tokio::spawn(async move { store::record_progress(&db, &claim, &cursor, &recovered, &setbacks, ttl).await }.in_current_span());
        // The next batch is read from here while this one's progress commits.
        self.cursor = next.clone();
        self.recording = Some(Recording { next, settled, write });
        if stopped {
            // The next read includes the failed row: it must see its attempts.
            if self.recorded().await == Recorded::Lost {
                return Some(End::Lost);
            }
        }
        None
    }

    /// Waits for the progress write under way, if any (the wait is the
    /// relay's `record_us`: the part of the write the next read did not hide).
    async fn recorded(&mut self) -> Recorded {
        let Some(Recording { next, settled, write }) = self.recording.take() else {
            return Recorded::Yes;
        };
        let started = Instant::now();
        let outcome = match write.await {
            Ok(outcome) => outcome,
            Err(e) => Err(StoreError::Config(format!("progress write task failed: {e}"))),
        };
        RelayCounters::time(&self.shared.counters.record_us, started);
        match outcome {
            Ok(Fence::Held) => {
                self.persisted = next;
                self.count(&settled);
                debug!(slice = self.claim.slice, delivered = settled.delivered.len(), "batch recorded");
                Recorded::Yes
            }
            Ok(Fence::Lost) => {
                RelayCounters::add(&self.shared.counters.fenced, 1);
                warn!(slice = self.claim.slice, token = %self.claim.token, "lease lost: progress refused; another relay owns the slice");
                Recorded::Lost
            }
            Err(e) => {
                warn!(slice = self.claim.slice, error = %e, "recording progress failed; the batch will be published again");
                self.unrecorded();
                Recorded::Failed
            }
        }
    }

    /// Sends the batch and awaits every verdict. `None` when asked to stop
    /// and the verdicts did not all come within the drain time.
    async fn publish(&self, rows: &[OutboxRow], lane: Lane, stop: &CancellationToken) -> Option<Vec<Result<(), PublishError>>> {
        let deliveries = self.shared.publisher.send_all(rows, lane).await;
        RelayCounters::add(&self.shared.counters.sent, rows.len());
        let all = join_all(deliveries);
        tokio::pin!(all);
        tokio::select! {
            verdicts = &mut all => Some(verdicts),
            _ = stop.cancelled() => tokio::time::timeout(self.shared.config.drain, &mut all).await.ok(),
        }
    }

    /// The batch's progress was not written: go back to the recorded cursor,
    /// so the same rows are published again (same CloudEvents ids).
    fn unrecorded(&mut self) {
        RelayCounters::add(&self.shared.counters.unrecorded, 1);
        self.cursor = self.persisted.clone();
    }

    fn count(&self, settled: &Settled) {
        let stats = &self.shared.counters;
        RelayCounters::add(&stats.delivered, settled.delivered.len());
        for setback in &settled.setbacks {
            if setback.status == outbox::RETRYABLE_FAILED {
                RelayCounters::add(&stats.retried, 1);
            } else {
                RelayCounters::add(&stats.set_aside, 1);
            }
        }
    }

    /// Nothing to read: wait for a NOTIFY (PostgreSQL) or poll with backoff.
    async fn idle_wait(&mut self, stop: &CancellationToken) {
        RelayCounters::add(&self.shared.counters.idle, 1);
        let config = &self.shared.config;
        let wait = match self.shared.db.backend() {
            Backend::Postgres => config.idle_max,
            Backend::Sqlite => {
                let wait = self.idle;
                self.idle = (self.idle * 2).min(config.idle_max);
                wait
            }
        };
        self.pause(stop, wait, true).await;
    }

    async fn pause(&mut self, stop: &CancellationToken, wait: Duration, wakeable: bool) {
        let woken = async {
            if wakeable {
                let _ = self.wake.changed().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = woken => {}
        }
    }
}

/// Time left before the head row may be retried.
fn backoff_left(head: &OutboxRow) -> Option<Duration> {
    let left = head.next_attempt_at_ms? - now_ms();
    (left > 0).then(|| Duration::from_millis(left as u64))
}

/// A batch's verdicts turned into what to record.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Settled {
    pub delivered: Vec<i64>,
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
            settled.delivered.push(row.seq);
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
