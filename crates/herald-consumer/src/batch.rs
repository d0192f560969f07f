//! Applying one batch of records: one transaction inserts the inbox rows and
//! applies the handler to the events seen for the first time. A permanent
//! failure splits the batch into one transaction per record so that only the
//! culprit is retried (boundedly) and then dead-lettered; a retryable failure
//! pauses the subscription and retries, and never dead-letters. With
//! per-key order, the records of a key blocked by a dead letter are parked
//! in the same transactions instead of applied (see `parking`).

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use herald_envelope::{DecodedEvent, EventKey, Registry, decode_any_with};
use herald_store::dead_letter::{self, NewDeadLetter};
use herald_store::inbox::{self, Delivery, Entry, PgEntry};
use herald_store::{Db, StoreError, Tx, positions};
use rdkafka::message::{Message, OwnedMessage};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use crate::handler::Record;
use crate::letters::{self, Backoff};
use crate::metrics::{Metrics, StageTimes};
use crate::parking::{self, Blocked, Verdict};
use crate::{Handler, HandlerError, Order, SubscriptionOptions, WritePath};

/// Each record of a batch decoded (or why not), in the batch's order.
pub(crate) type Decoded = Vec<Result<DecodedEvent, String>>;

/// Decodes `batch`; CPU only, so the runtime runs it on the blocking pool
/// while the previous batch's transaction is in the database.
/// A record naming a schema `registry` lacks decodes to `unknown schema <file>`.
pub(crate) fn decode(batch: &[OwnedMessage], registry: &Registry) -> Decoded {
    batch.iter().map(|m| decode_any_with(m, registry).map_err(|e| e.to_string())).collect()
}

/// A record as the subscription sees it before touching the database.
// Nearly every record is an `Event`: boxing it would allocate once per
// record to save memory on the rare `Skip` and `Poison`.
#[allow(clippy::large_enum_variant)]
enum Parsed {
    Event(DecodedEvent),
    /// An event of a type the handler does not apply.
    Skip,
    /// Not decodable: permanent, retrying the same bytes gives the same answer.
    Poison(String),
}

#[derive(Default, Clone, Copy)]
struct Counts {
    applied: u64,
    duplicates: u64,
    skipped: u64,
    dead: u64,
    parked: u64,
}

pub(crate) struct Applier<'a, H> {
    pub db: &'a Db,
    /// The native PostgreSQL pool of the handler's fast path
    /// ([`Handler::applies_pg`]), if it has one and the database is PostgreSQL.
    pub native: Option<&'a PgPool>,
    pub subscription: &'a str,
    pub handler: &'a H,
    pub options: &'a SubscriptionOptions,
    /// `options.order`, else what the handler declares.
    pub order: Order,
    pub metrics: &'a Metrics,
}

impl<H: Handler> Applier<'_, H> {
    /// Applies `batch` until it settled. `false`: shutdown interrupted a
    /// retry, nothing of the batch may be acknowledged.
    pub async fn apply(&self, batch: &[OwnedMessage], decoded: Decoded, shutdown: &CancellationToken) -> bool {
        let parsed: Vec<Parsed> = decoded.into_iter().map(|d| self.parse(d)).collect();
        let _spans = self.apply_spans(batch, &parsed);
        let mut backoff = Backoff::new();
        loop {
            match self.try_batch(batch, &parsed).await {
                Ok(counts) => {
                    self.count(&counts);
                    return true;
                }
                // A conflict the native path did not resolve itself: pause and try again.
                Err(HandlerError::Retryable(reason) | HandlerError::Conflict(reason)) => {
                    warn!(subscription = self.subscription, %reason, "batch failed, retryable; pausing");
                    Metrics::add(&self.metrics.retries, 1);
                    if !backoff.wait(shutdown).await {
                        return false;
                    }
                }
                Err(HandlerError::Reject(reason)) => {
                    warn!(subscription = self.subscription, %reason, records = batch.len(), "batch rejected; applying its records one by one");
                    return self.one_by_one(batch, &parsed, shutdown).await;
                }
            }
        }
    }

    /// While spans are exported: one per event, child of the span that
    /// appended it, open until the batch settled (its transaction is the
    /// apply of every record in it).
    fn apply_spans(&self, batch: &[OwnedMessage], parsed: &[Parsed]) -> Vec<tracing::Span> {
        if !herald_trace::recording() {
            return Vec::new();
        }
        let events = batch.iter().zip(parsed).filter_map(|(msg, p)| match p {
            Parsed::Event(event) => Some((msg, event)),
            Parsed::Skip | Parsed::Poison(_) => None,
        });
        events
            .map(|(msg, event)| {
                let span = tracing::info_span!(
                    parent: None,
                    "subscription.apply",
                    subscription = self.subscription,
                    event_id = %event.key.id,
                    event_type = %event.event_type,
                    "messaging.destination.partition.id" = msg.partition(),
                    "messaging.kafka.offset" = msg.offset(),
                );
                herald_trace::set_parent(&span, event.trace.as_ref());
                span
            })
            .collect()
    }

    fn parse(&self, decoded: Result<DecodedEvent, String>) -> Parsed {
        match decoded {
            Ok(event) if self.handler.handles(&event.event_type) => Parsed::Event(event),
            Ok(_) => Parsed::Skip,
            Err(reason) => Parsed::Poison(reason),
        }
    }

    fn count(&self, c: &Counts) {
        let m = self.metrics;
        Metrics::add(&m.applied, c.applied);
        Metrics::add(&m.duplicates, c.duplicates);
        Metrics::add(&m.skipped, c.skipped);
        Metrics::add(&m.dead_lettered, c.dead);
        Metrics::add(&m.parked, c.parked);
        Metrics::add(&m.batches, 1);
    }

    /// The batch's blocked keys, read after its partitions' locks; `None`
    /// without per-key order (nothing is ever parked then).
    async fn blocked(&self, tx: &mut Tx<'_>, batch: &[OwnedMessage]) -> Result<Option<Blocked>, StoreError> {
        match self.order {
            Order::None => Ok(None),
            Order::PerKey => Ok(Some(Blocked::load(tx, self.subscription, batch).await?)),
        }
    }

    async fn try_batch(&self, batch: &[OwnedMessage], parsed: &[Parsed]) -> Result<Counts, HandlerError> {
        // Nothing to park or dead-letter: the native path has no statements for either.
        if let Some(pool) = self.native
            && self.order == Order::None
            && let Some(plain) = Plain::of(batch, parsed)
        {
            return self.try_batch_pg(pool, batch, plain).await;
        }
        self.try_batch_any(batch, parsed).await
    }

    /// [`Applier::try_batch_any`] for a batch without undecodable records
    /// and without per-key order, on sqlx's native PostgreSQL driver: plain
    /// inserts first, and only if a row was already there (a redelivery, a
    /// rewind, a competing member) the same batch again in a new transaction,
    /// resolving what is there.
    async fn try_batch_pg(&self, pool: &PgPool, batch: &[OwnedMessage], plain: Plain<'_>) -> Result<Counts, HandlerError> {
        match self.try_batch_pg_on(pool, batch, &plain, WritePath::Plain).await {
            Err(HandlerError::Conflict(reason)) => {
                debug!(subscription = self.subscription, %reason, "batch met rows already there; applying it again, resolving them");
                self.try_batch_pg_on(pool, batch, &plain, WritePath::Upsert).await
            }
            outcome => outcome,
        }
    }

    /// One transaction of [`Applier::try_batch_pg`]: positions, inbox rows
    /// and the handler's writes, a statement each (round trips cost most on
    /// a busy machine, so none is spent on a savepoint).
    async fn try_batch_pg_on(
        &self,
        pool: &PgPool,
        batch: &[OwnedMessage],
        plain: &Plain<'_>,
        path: WritePath,
    ) -> Result<Counts, HandlerError> {
        let mut entries: Vec<PgEntry<'_>> = plain
            .candidates
            .iter()
            .map(|(msg, e)| PgEntry {
                key: &e.key,
                event_type: &e.event_type,
                topic: msg.topic(),
                partition: msg.partition(),
                offset: msg.offset(),
            })
            .collect();
        // Keys in one order in every transaction, as `admit_batch` sorts them.
        entries.sort_by(|a, b| a.key.cmp(b.key));
        let time = &self.metrics.time;
        let mut lap = Instant::now();
        let mut tx = positions::begin_advancing(pool, self.subscription, &next_offsets(batch)).await.map_err(StoreError::from)?;
        StageTimes::lap(&time.begin_us, &mut lap);
        let admitted = admit_pg(&mut tx, self.subscription, &entries, path).await?;
        let new: Vec<Record<'_>> =
            plain.candidates.iter().filter(|(_, e)| admitted.admits(&e.key)).map(|(msg, e)| record(msg, e)).collect();
        StageTimes::lap(&time.inbox_us, &mut lap);
        self.handler.apply_pg(&mut tx, &new, path).await?;
        StageTimes::lap(&time.handler_us, &mut lap);
        tx.commit().await.map_err(StoreError::from)?;
        StageTimes::lap(&time.commit_us, &mut lap);
        let mut counts = Counts { applied: new.len() as u64, ..plain.counts };
        counts.duplicates += (plain.candidates.len() - new.len()) as u64;
        Ok(counts)
    }

    async fn try_batch_any(&self, batch: &[OwnedMessage], parsed: &[Parsed]) -> Result<Counts, HandlerError> {
        let mut counts = Counts::default();
        let mut seen = HashSet::new();
        let mut entries = Vec::new();
        let mut candidates = Vec::new();
        let mut dead = Vec::new();
        let time = &self.metrics.time;
        let mut lap = Instant::now();
        let mut tx = self.db.begin().await?;
        advance_positions(&mut tx, self.subscription, batch).await?;
        StageTimes::lap(&time.begin_us, &mut lap);
        let mut blocked = self.blocked(&mut tx, batch).await?;
        for (msg, p) in batch.iter().zip(parsed) {
            // A type the handler skips is applied by nobody: no order to keep.
            let verdict = match (&blocked, p) {
                (Some(b), Parsed::Event(_) | Parsed::Poison(_)) => b.verdict(msg),
                _ => Verdict::Free,
            };
            match (verdict, p) {
                (Verdict::Kept, _) => counts.duplicates += 1,
                (Verdict::Park, _) if parking::park(&mut tx, self.subscription, msg).await? => counts.parked += 1,
                (Verdict::Park, _) => counts.duplicates += 1,
                (Verdict::Free, Parsed::Event(event)) if seen.insert(&event.key) => {
                    entries.push(Entry { key: &event.key, event_type: &event.event_type, delivery: delivery(msg) });
                    candidates.push((msg, event));
                }
                // The same fact twice in one batch (e.g. both envelopes).
                (Verdict::Free, Parsed::Event(_)) => counts.duplicates += 1,
                (Verdict::Free, Parsed::Skip) => counts.skipped += 1,
                (Verdict::Free, Parsed::Poison(reason)) => {
                    let letter = letters::letter(self.subscription, msg, None, reason, 1);
                    // A letter kept before (redelivery) blocks from the database already.
                    if dead_letter::insert(&mut tx, &letter).await? {
                        if let Some(b) = &mut blocked {
                            b.block(msg);
                        }
                    }
                    dead.push(letter);
                }
            }
        }
        let first = inbox::admit_batch(&mut tx, self.subscription, &entries).await?;
        StageTimes::lap(&time.inbox_us, &mut lap);
        let new: Vec<Record<'_>> = candidates.iter().filter(|(_, e)| first.contains(&e.key)).map(|(msg, e)| record(msg, e)).collect();
        self.handler.apply(&mut tx, &new).await?;
        StageTimes::lap(&time.handler_us, &mut lap);
        tx.commit().await.map_err(StoreError::from)?;
        StageTimes::lap(&time.commit_us, &mut lap);
        dead.iter().for_each(letters::log_dead);
        counts.dead = dead.len() as u64;
        counts.applied = new.len() as u64;
        counts.duplicates += (candidates.len() - new.len()) as u64;
        Ok(counts)
    }

    async fn one_by_one(&self, batch: &[OwnedMessage], parsed: &[Parsed], shutdown: &CancellationToken) -> bool {
        let mut counts = Counts::default();
        for (msg, p) in batch.iter().zip(parsed) {
            let settled = match p {
                Parsed::Skip => {
                    counts.skipped += 1;
                    true
                }
                Parsed::Poison(reason) => self.set_aside(msg, None, reason, 1, &mut counts, shutdown).await,
                Parsed::Event(event) => self.apply_single(msg, event, &mut counts, shutdown).await,
            };
            if !settled {
                // Records applied so far are in the database; their offsets are
                // not stored, so they are redelivered and absorbed by the inbox.
                return false;
            }
        }
        self.count(&counts);
        true
    }

    /// One record in its own transaction; a rejection is retried up to
    /// `max_attempts` times, then the record is dead-lettered.
    async fn apply_single(&self, msg: &OwnedMessage, event: &DecodedEvent, counts: &mut Counts, shutdown: &CancellationToken) -> bool {
        let mut rejections = 0;
        let mut backoff = Backoff::new();
        loop {
            match self.try_single(msg, event).await {
                Ok(Single::Applied) => counts.applied += 1,
                Ok(Single::Duplicate) => counts.duplicates += 1,
                Ok(Single::Parked) => counts.parked += 1,
                Err(HandlerError::Retryable(reason) | HandlerError::Conflict(reason)) => {
                    warn!(subscription = self.subscription, id = %event.key.id, %reason, "record failed, retryable; pausing");
                    Metrics::add(&self.metrics.retries, 1);
                    if !backoff.wait(shutdown).await {
                        return false;
                    }
                    continue;
                }
                Err(HandlerError::Reject(reason)) => {
                    rejections += 1;
                    if rejections < self.options.max_attempts {
                        tokio::time::sleep(letters::rejection_pause(rejections)).await;
                        continue;
                    }
                    return self.set_aside(msg, Some(event), &reason, rejections, counts, shutdown).await;
                }
            }
            return true;
        }
    }

    async fn try_single(&self, msg: &OwnedMessage, event: &DecodedEvent) -> Result<Single, HandlerError> {
        let mut tx = self.db.begin().await?;
        advance_positions(&mut tx, self.subscription, std::slice::from_ref(msg)).await?;
        let verdict = self.blocked(&mut tx, std::slice::from_ref(msg)).await?.map_or(Verdict::Free, |b| b.verdict(msg));
        let outcome = match verdict {
            Verdict::Park if parking::park(&mut tx, self.subscription, msg).await? => Single::Parked,
            Verdict::Park | Verdict::Kept => Single::Duplicate,
            Verdict::Free => {
                let entry = Entry { key: &event.key, event_type: &event.event_type, delivery: delivery(msg) };
                if inbox::admit_batch(&mut tx, self.subscription, &[entry]).await?.is_empty() {
                    Single::Duplicate
                } else {
                    self.handler.apply(&mut tx, &[record(msg, event)]).await?;
                    Single::Applied
                }
            }
        };
        tx.commit().await.map_err(StoreError::from)?;
        Ok(outcome)
    }

    /// Writes the dead letter, retrying until the database takes it: the
    /// partition may move past a record only once the record is kept. With
    /// per-key order, a record whose key is blocked meanwhile is parked
    /// instead.
    async fn set_aside(
        &self,
        msg: &OwnedMessage,
        event: Option<&DecodedEvent>,
        reason: &str,
        attempts: u32,
        counts: &mut Counts,
        shutdown: &CancellationToken,
    ) -> bool {
        let identity = event.map(|e| (&e.key, e.event_type.as_str()));
        let letter = letters::letter(self.subscription, msg, identity, reason, attempts);
        if self.order == Order::None {
            let stored = letters::keep(self.db, &letter, shutdown, || Metrics::add(&self.metrics.retries, 1)).await;
            counts.dead += u64::from(stored);
            return stored;
        }
        let mut backoff = Backoff::new();
        loop {
            match self.try_set_aside(msg, &letter).await {
                Ok(Verdict::Free) => {
                    letters::log_dead(&letter);
                    counts.dead += 1;
                    return true;
                }
                Ok(Verdict::Park) => {
                    counts.parked += 1;
                    return true;
                }
                Ok(Verdict::Kept) => return true,
                Err(e) => {
                    error!(subscription = self.subscription, error = %e, "cannot store dead letter; pausing");
                    Metrics::add(&self.metrics.retries, 1);
                    if !backoff.wait(shutdown).await {
                        return false;
                    }
                }
            }
        }
    }

    /// One transaction: the partition's lock, then the letter — or the
    /// record parked, if its key is blocked. Returns what was done.
    async fn try_set_aside(&self, msg: &OwnedMessage, letter: &NewDeadLetter<'_>) -> Result<Verdict, StoreError> {
        let mut tx = self.db.begin().await?;
        positions::lock_partition(&mut tx, self.subscription, msg.topic(), msg.partition()).await?;
        let verdict = Blocked::load(&mut tx, self.subscription, std::slice::from_ref(msg)).await?.verdict(msg);
        match verdict {
            Verdict::Free => {
                dead_letter::insert(&mut tx, letter).await?;
            }
            Verdict::Park => {
                parking::park(&mut tx, self.subscription, msg).await?;
            }
            Verdict::Kept => {}
        }
        tx.commit().await?;
        Ok(verdict)
    }
}

/// A batch the native path can apply — nothing undecodable in it — sorted
/// into the events seen first in it and what the rest count as.
struct Plain<'b> {
    counts: Counts,
    candidates: Vec<(&'b OwnedMessage, &'b DecodedEvent)>,
}

impl<'b> Plain<'b> {
    /// `None` when a record is undecodable: its dead letter needs the shared path.
    fn of(batch: &'b [OwnedMessage], parsed: &'b [Parsed]) -> Option<Plain<'b>> {
        let mut plain = Plain { counts: Counts::default(), candidates: Vec::new() };
        let mut seen = HashSet::new();
        for (msg, p) in batch.iter().zip(parsed) {
            match p {
                Parsed::Event(event) if seen.insert(&event.key) => plain.candidates.push((msg, event)),
                Parsed::Event(_) => plain.counts.duplicates += 1,
                Parsed::Skip => plain.counts.skipped += 1,
                Parsed::Poison(_) => return None,
            }
        }
        Some(plain)
    }
}

/// Which keys of a batch its inbox rows admitted.
pub(crate) enum Admitted {
    /// A plain insert went through: every key was new.
    All,
    /// The keys seen for the first time.
    Only(HashSet<EventKey>),
}

impl Admitted {
    pub(crate) fn admits(&self, key: &EventKey) -> bool {
        match self {
            Admitted::All => true,
            Admitted::Only(first) => first.contains(key),
        }
    }
}

/// The inbox rows of a native batch (live or replay), as `path` says: a
/// plain insert that fails with [`HandlerError::Conflict`] on a key already
/// there, or the conflict-skipping insert that names the new keys.
pub(crate) async fn admit_pg(
    conn: &mut sqlx::PgConnection,
    scope: &str,
    entries: &[PgEntry<'_>],
    path: WritePath,
) -> Result<Admitted, HandlerError> {
    match path {
        WritePath::Plain => {
            inbox::insert_batch_pg(conn, scope, entries).await.map_err(HandlerError::from_plain_write)?;
            Ok(Admitted::All)
        }
        WritePath::Upsert => Ok(Admitted::Only(inbox::admit_batch_pg(conn, scope, entries).await.map_err(StoreError::from)?)),
    }
}

/// What one record's own transaction did.
enum Single {
    Applied,
    Duplicate,
    Parked,
}

fn record<'a>(msg: &OwnedMessage, event: &'a DecodedEvent) -> Record<'a> {
    Record { event, partition: msg.partition(), offset: msg.offset() }
}

/// The first statement of every batch transaction: see `herald_store::positions`.
async fn advance_positions(tx: &mut herald_store::Tx<'_>, subscription: &str, batch: &[OwnedMessage]) -> Result<(), StoreError> {
    for (topic, next) in next_offsets(batch) {
        positions::advance(tx, subscription, topic, &next).await?;
    }
    Ok(())
}

/// Per topic and partition, the offset after the batch's last record.
fn next_offsets(batch: &[OwnedMessage]) -> BTreeMap<&str, BTreeMap<i32, i64>> {
    let mut by_topic: BTreeMap<&str, BTreeMap<i32, i64>> = BTreeMap::new();
    for msg in batch {
        let next = by_topic.entry(msg.topic()).or_default().entry(msg.partition()).or_insert(0);
        *next = (*next).max(msg.offset() + 1);
    }
    by_topic
}

fn delivery(msg: &OwnedMessage) -> Delivery<'_> {
    Delivery { topic: msg.topic(), partition: msg.partition(), offset: msg.offset() }
}
