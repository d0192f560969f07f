//! One claimed slice: read forward, publish, await every verdict, record
//! progress under the claim's token.
//!
//! Up to `in_flight` batches of a slice are out at once — sent, and their
//! progress not yet committed: the next batch is read and sent while the
//! acknowledgements of the one before come back, and the next read goes on
//! while a progress write commits. What keeps that safe:
//!
//! - Progress is written in batch order, one write at a time, each only
//!   after every verdict of its batch. A relay that takes the slice over
//!   starts where the first unrecorded batch started and sends everything
//!   after it again; however the two relays' records interleave in Kafka,
//!   the first copy of each record of a key comes in order, because one
//!   producer keeps a partition's records in the order they were sent.
//! - A slice's batches out at once all go through one producer: a batch that
//!   needs the other lane waits until the slice has nothing out.
//! - Whatever goes wrong with a batch (its progress write fails, its
//!   acknowledgement is lost, a row of it fails retryably) drops the batches
//!   sent behind it: they go out again after it, as duplicates under the
//!   same ids, which the inboxes absorb. A retryable failure is recorded
//!   before reading on: the next read includes the failed row and must see
//!   its attempts.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt};
use herald_fault::{Action, Point};
use herald_store::StoreError;
use herald_store::outbox::OutboxRow;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, warn};

use crate::claims::{self as store, Claim, Cursor, Fence};
use crate::publish::{Lane, in_order};
use crate::relay::Shared;
use crate::settle::{Settled, Tally, settle};
use crate::{PublishError, RelayCounters};

mod waits;

use waits::{announced, backoff_left};

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
        sent: VecDeque::new(),
        held: None,
        recording: None,
        drain_until: None,
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
    /// Cursor as last recorded; after a failure everything is read again
    /// from here.
    persisted: Cursor,
    /// Where the next read starts: after the last batch sent.
    cursor: Cursor,
    wake: watch::Receiver<u64>,
    idle: Duration,
    /// Batches sent whose verdicts are not settled yet, oldest first.
    sent: VecDeque<Sent>,
    /// A batch read but not sent, because batches are out and it needs the
    /// other producer or its first row waits for a retry.
    held: Option<Read>,
    /// The last settled batch's progress write, committing meanwhile.
    recording: Option<Recording>,
    /// When a stopping slice gives up on the acknowledgements still out.
    drain_until: Option<tokio::time::Instant>,
}

/// Rows read from `from` (a cursor whose snapshot is set), at most `limit`.
struct Read {
    rows: Vec<OutboxRow>,
    from: Cursor,
    limit: i64,
}

impl Read {
    /// A full batch means a backlog (the lingering producer); anything less
    /// also means the read returned everything left in its step.
    fn lane(&self) -> Lane {
        if (self.rows.len() as i64) < self.limit { Lane::Live } else { Lane::Backlog }
    }
}

/// A batch handed to the producer.
struct Sent {
    read: Read,
    lane: Lane,
    verdicts: BoxFuture<'static, Vec<Result<(), PublishError>>>,
}

/// A progress write under way.
struct Recording {
    next: Cursor,
    tally: Tally,
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

/// What the slice does next.
enum Next {
    Fill,
    Settle,
    End(End),
}

/// How the wait for the oldest batch's verdicts ended.
enum Head {
    Verdicts(Vec<Result<(), PublishError>>),
    /// New rows were announced and there is room to send them.
    Woken,
    /// Stopping, and the verdicts did not come within the drain time.
    Abandoned,
}

impl Worker {
    async fn work(&mut self, stop: &CancellationToken) -> End {
        loop {
            let next = if stop.is_cancelled() { Next::Settle } else { self.fill(stop).await };
            match next {
                Next::End(end) => return end,
                Next::Fill => continue,
                Next::Settle => {}
            }
            if self.sent.is_empty() {
                if stop.is_cancelled() {
                    return End::Released;
                }
                continue;
            }
            if let Some(end) = self.settle_head(stop).await {
                return end;
            }
        }
    }

    /// Reads and sends batches until `in_flight` are out or nothing is left.
    async fn fill(&mut self, stop: &CancellationToken) -> Next {
        let shared = Arc::clone(&self.shared);
        let config = &shared.config;
        while self.sent.len() < self.in_flight() {
            let read = match self.held.take() {
                Some(read) => read,
                None => match self.read().await {
                    Ok(read) => read,
                    Err(e) => {
                        warn!(slice = self.claim.slice, error = %e, "reading the outbox failed; retrying");
                        if !self.sent.is_empty() {
                            return Next::Settle;
                        }
                        self.pause(stop, config.idle_max, false).await;
                        return Next::Fill;
                    }
                },
            };
            if read.rows.is_empty() {
                self.cursor = read.from.after(None, true);
                return if self.sent.is_empty() { self.rest(stop).await } else { Next::Settle };
            }
            self.idle = config.idle_min;
            let lane = read.lane();
            let retry_in = backoff_left(&read.rows[0]);
            let lane_busy = self.sent.back().is_some_and(|last| last.lane != lane);
            if retry_in.is_some() || lane_busy {
                self.held = Some(read);
                return match retry_in {
                    Some(wait) if self.sent.is_empty() => {
                        self.pause(stop, wait, false).await;
                        Next::Fill
                    }
                    _ => Next::Settle,
                };
            }
            // A batch whose progress is still being written counts as out:
            // this one was read meanwhile and waits for that write.
            if self.out() >= self.in_flight() {
                match self.recorded().await {
                    Recorded::Lost => return Next::End(End::Lost),
                    Recorded::Failed => return Next::Fill,
                    Recorded::Yes => {}
                }
            }
            self.send(read, lane).await;
        }
        Next::Settle
    }

    /// Batches sent and not yet recorded: those awaiting verdicts, and the
    /// one whose progress write is under way.
    fn out(&self) -> usize {
        self.sent.len() + usize::from(self.recording.is_some())
    }

    fn in_flight(&self) -> usize {
        self.shared.config.in_flight.max(1)
    }

    async fn read(&mut self) -> Result<Read, StoreError> {
        // Rows announced from here on wake the slice again.
        self.wake.borrow_and_update();
        let started = Instant::now();
        let limit = self.shared.batch_size();
        let (rows, from) = store::read(&self.shared.reader, self.claim.slice, &self.cursor, limit).await?;
        RelayCounters::time(&self.shared.counters.read_us, started);
        Ok(Read { rows, from, limit })
    }

    async fn send(&mut self, read: Read, lane: Lane) {
        let step_done = lane == Lane::Live;
        if lane == Lane::Backlog {
            RelayCounters::add(&self.shared.counters.backlog_batches, 1);
        }
        // The next read goes on as if every row is delivered; if not, what
        // was read from here is dropped.
        self.cursor = read.from.after(read.rows.last().map(|r| (r.xid, r.seq)), step_done);
        let deliveries = self.shared.publisher.send_all(&read.rows, lane).await;
        RelayCounters::add(&self.shared.counters.sent, read.rows.len());
        RelayCounters::add(&self.shared.counters.batches, 1);
        self.sent.push_back(Sent { read, lane, verdicts: in_order(deliveries).boxed() });
    }

    /// Settles the oldest batch out and starts its progress write once the
    /// one before it has committed; `Some` ends the slice.
    async fn settle_head(&mut self, stop: &CancellationToken) -> Option<End> {
        let verdicts = match self.await_head(stop).await {
            Head::Woken => return None,
            Head::Abandoned => {
                // Stopping with acknowledgements outstanding: record nothing.
                RelayCounters::add(&self.shared.counters.unrecorded, 1);
                return Some(End::Released);
            }
            Head::Verdicts(verdicts) => verdicts,
        };
        let Sent { read, lane, .. } = self.sent.pop_front()?;
        self.shared.publisher.check_fatal(&verdicts, lane);
        // Progress is written in batch order.
        match self.recorded().await {
            Recorded::Lost => return Some(End::Lost),
            Recorded::Failed => return None,
            Recorded::Yes => {}
        }
        let shared = Arc::clone(&self.shared);
        let config = &shared.config;
        let settled = settle(&read.rows, verdicts, config.max_attempts, |a| config.backoff(a));
        let next = read.from.after(settled.last_done, lane == Lane::Live && !settled.stopped);
        let rows_n = i64::try_from(read.rows.len()).unwrap_or(i64::MAX);
        if let Action::LoseAck | Action::Fail(_) = config.faults.at(Point::BeforeProgress, &self.claim.slice.to_string(), rows_n).await {
            warn!(slice = self.claim.slice, "fault: acknowledgement lost before progress was recorded");
            self.unrecorded();
            return None;
        }
        let stopped = settled.stopped;
        if stopped {
            // Rows after the failed one go out again after its retry.
            self.drop_sent();
            self.cursor = next.clone();
        }
        let (db, claim, cursor, ttl) = (self.shared.db.clone(), self.claim.clone(), next.clone(), config.lease_ms());
        let tally = settled.tally();
        let Settled { recovered, setbacks, .. } = settled;
        let write =
            tokio::spawn(async move { store::record_progress(&db, &claim, &cursor, &recovered, &setbacks, ttl).await }.in_current_span());
        self.recording = Some(Recording { next, tally, write });
        if stopped && self.recorded().await == Recorded::Lost {
            return Some(End::Lost);
        }
        None
    }

    /// Waits for the oldest batch's verdicts — or for new rows while there
    /// is room to send them; a stopping slice waits at most until `drain`
    /// after it was asked to stop.
    async fn await_head(&mut self, stop: &CancellationToken) -> Head {
        let started = Instant::now();
        let room = self.out() < self.in_flight() && self.held.is_none() && !stop.is_cancelled();
        let drain = self.shared.config.drain;
        let Worker { sent, wake, drain_until, .. } = self;
        let Some(head) = sent.front_mut() else { return Head::Woken };
        let head = tokio::select! {
            verdicts = &mut head.verdicts => Head::Verdicts(verdicts),
            _ = announced(wake), if room => Head::Woken,
            _ = stop.cancelled() => {
                let until = *drain_until.get_or_insert_with(|| tokio::time::Instant::now() + drain);
                match tokio::time::timeout_at(until, &mut head.verdicts).await {
                    Ok(verdicts) => Head::Verdicts(verdicts),
                    Err(_) => Head::Abandoned,
                }
            }
        };
        RelayCounters::time(&self.shared.counters.publish_us, started);
        head
    }

    /// Waits for the progress write under way, if any (the wait is the
    /// relay's `record_us`: the part of the write nothing else hid).
    async fn recorded(&mut self) -> Recorded {
        let Some(Recording { next, tally, write }) = self.recording.take() else {
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
                self.count(tally);
                debug!(slice = self.claim.slice, delivered = tally.delivered, "batch recorded");
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

    /// A batch's progress was not written: go back to the recorded cursor,
    /// so the same rows — and everything sent behind them — are published
    /// again (same CloudEvents ids).
    fn unrecorded(&mut self) {
        RelayCounters::add(&self.shared.counters.unrecorded, 1);
        self.drop_sent();
        self.cursor = self.persisted.clone();
    }

    /// Forgets the batches out and the one held; their records may still
    /// reach the broker, and go out again when read again.
    fn drop_sent(&mut self) {
        self.sent.clear();
        self.held = None;
    }

    fn count(&self, tally: Tally) {
        let stats = &self.shared.counters;
        RelayCounters::add(&stats.delivered, tally.delivered);
        RelayCounters::add(&stats.retried, tally.retried);
        RelayCounters::add(&stats.set_aside, tally.set_aside);
    }
}
