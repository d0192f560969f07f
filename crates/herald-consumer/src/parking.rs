//! Per-key parking ([`Order::PerKey`](crate::Order::PerKey)): once a record
//! of a key is dead-lettered, the key's later records are parked behind it
//! (`herald_store::parked`) in the transaction that would have applied
//! them, and released — applied in offset order through the same inbox and
//! handler — by the transaction that redrives or discards the letter.
//!
//! Both sides take the partition's lock first (the position row every batch
//! advances), so a batch either parks before a release reads the parked
//! records, or reads the blocked keys after the release committed: nothing
//! is parked behind a letter that is no longer dead.

use std::collections::{HashMap, HashSet};

use herald_envelope::{DecodedEvent, Registry, decode_any_with};
use herald_store::dead_letter;
use herald_store::inbox::{self, Delivery, Entry};
use herald_store::parked::{self, KeyRef, NewParked, Parked};
use herald_store::{StoreError, Tx};
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage, Timestamp};

use crate::letters;
use crate::{Handler, HandlerError, Record};

/// (topic, partition, record key): a key as Kafka orders it.
type Key = (String, i32, Vec<u8>);

/// What a per-key batch does with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Its key is not blocked: apply (or dead-letter) it as usual.
    Free,
    /// Its key is blocked at an earlier offset: park it.
    Park,
    /// It is itself a letter of its key (redelivered): kept already, and its
    /// letter decides what becomes of it.
    Kept,
}

/// The blocked keys of a batch's partitions, read after the partitions'
/// locks, and kept current as the batch dead-letters records.
#[derive(Debug, Default)]
pub(crate) struct Blocked {
    /// Key → the offset from which its records are parked: its first `dead`
    /// letter or first parked record, whichever is earlier.
    from: HashMap<Key, i64>,
    /// Positions of letters (any status) among the batch's records.
    letters: HashSet<(String, i32, i64)>,
}

impl Blocked {
    /// Reads the blocks of every partition of `batch`; call after
    /// `batch`'s partitions are locked.
    pub async fn load(tx: &mut Tx<'_>, subscription: &str, batch: &[OwnedMessage]) -> Result<Blocked, StoreError> {
        let mut ranges: HashMap<(&str, i32), (i64, i64)> = HashMap::new();
        for msg in batch {
            let range = ranges.entry((msg.topic(), msg.partition())).or_insert((msg.offset(), msg.offset()));
            *range = (range.0.min(msg.offset()), range.1.max(msg.offset()));
        }
        let mut blocked = Blocked::default();
        for ((topic, partition), (low, high)) in ranges {
            let blocks = parked::blocks(tx, subscription, topic, partition).await?;
            for (key, offset) in blocks.dead_letters.into_iter().chain(blocks.first_parked) {
                let from = blocked.from.entry((topic.to_owned(), partition, key)).or_insert(offset);
                *from = (*from).min(offset);
            }
            // Also where nothing is blocked yet: a letter of this batch may
            // block a key whose later records were settled letters before.
            for offset in parked::letter_offsets(tx, subscription, topic, partition, low..=high).await? {
                blocked.letters.insert((topic.to_owned(), partition, offset));
            }
        }
        Ok(blocked)
    }

    pub fn verdict(&self, msg: &OwnedMessage) -> Verdict {
        let Some(key) = msg.key() else { return Verdict::Free };
        match self.from.get(&(msg.topic().to_owned(), msg.partition(), key.to_vec())) {
            Some(from) if msg.offset() >= *from => {
                if self.letters.contains(&(msg.topic().to_owned(), msg.partition(), msg.offset())) {
                    Verdict::Kept
                } else {
                    Verdict::Park
                }
            }
            _ => Verdict::Free,
        }
    }

    /// `msg` was just dead-lettered: its key's later records park behind it.
    pub fn block(&mut self, msg: &OwnedMessage) {
        if let Some(key) = msg.key() {
            let (topic, partition) = (msg.topic().to_owned(), msg.partition());
            self.letters.insert((topic.clone(), partition, msg.offset()));
            let from = self.from.entry((topic, partition, key.to_vec())).or_insert(msg.offset());
            *from = (*from).min(msg.offset());
        }
    }
}

/// Parks `msg` inside `tx`. `false`: it was parked before (a redelivery).
pub(crate) async fn park(tx: &mut Tx<'_>, subscription: &str, msg: &OwnedMessage) -> Result<bool, StoreError> {
    let Some(record_key) = msg.key() else {
        // Only a key can be blocked; `Blocked::verdict` frees keyless records.
        return Err(StoreError::Config("a record without a key cannot be parked".into()));
    };
    let key = KeyRef { subscription, topic: msg.topic(), partition: msg.partition(), record_key };
    parked::insert(tx, &NewParked { key, offset: msg.offset(), headers: letters::headers_of(msg), value: msg.payload() }).await
}

/// What applying one record through the inbox did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Applied,
    Duplicate,
    NotHandled,
}

/// Applies `event`, read from `msg`, through `subscription`'s inbox and
/// `handler` inside `tx`: what a redrive and a release do with a record.
pub(crate) async fn apply_one<H: Handler>(
    tx: &mut Tx<'_>,
    handler: &H,
    subscription: &str,
    msg: &OwnedMessage,
    event: &DecodedEvent,
) -> Result<Outcome, HandlerError> {
    if !handler.handles(&event.event_type) {
        return Ok(Outcome::NotHandled);
    }
    let delivery = Delivery { topic: msg.topic(), partition: msg.partition(), offset: msg.offset() };
    let entry = Entry { key: &event.key, event_type: &event.event_type, delivery };
    if inbox::admit_batch(tx, subscription, &[entry]).await?.is_empty() {
        return Ok(Outcome::Duplicate);
    }
    handler.apply(tx, &[Record { event, partition: msg.partition(), offset: msg.offset() }]).await?;
    Ok(Outcome::Applied)
}

/// What releasing a key's parked records did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Released {
    /// Applied now, in offset order.
    pub applied: u64,
    /// Facts the inbox had already applied: nothing applied again.
    pub duplicates: u64,
    /// Of types the handler does not handle.
    pub skipped: u64,
    /// The offset of a parked record that failed when released: it is a dead
    /// letter now, and the key's later records stay parked behind it.
    pub dead_lettered: Option<i64>,
    /// Records of the key still parked.
    pub still_parked: i64,
}

/// Applies `key`'s parked records in offset order inside `tx`, while no
/// `dead` letter of the key precedes the next one; each record behind a
/// savepoint, so one that fails becomes a dead letter (the new blocker) and
/// the rest stay parked. A retryable failure fails the whole transaction:
/// the caller's letter stays dead and everything stays parked.
/// Call with `key`'s partition locked.
pub(crate) async fn release<H: Handler>(
    tx: &mut Tx<'_>,
    handler: &H,
    registry: &Registry,
    key: &KeyRef<'_>,
) -> Result<Released, HandlerError> {
    let mut released = Released::default();
    while let Some(next) = parked::first(tx, key).await? {
        if parked::first_dead_letter(tx, key).await?.is_some_and(|letter| letter < next.offset) {
            break;
        }
        let msg = message_of(&next);
        savepoint(tx, "SAVEPOINT release_parked").await?;
        let decoded = decode_any_with(&msg, registry);
        let outcome = match &decoded {
            Ok(event) => apply_one(tx, handler, key.subscription, &msg, event).await,
            Err(e) => Err(HandlerError::Reject(e.to_string())),
        };
        match outcome {
            Ok(applied) => {
                savepoint(tx, "RELEASE SAVEPOINT release_parked").await?;
                match applied {
                    Outcome::Applied => released.applied += 1,
                    Outcome::Duplicate => released.duplicates += 1,
                    Outcome::NotHandled => released.skipped += 1,
                }
            }
            Err(HandlerError::Reject(reason)) => {
                savepoint(tx, "ROLLBACK TO SAVEPOINT release_parked").await?;
                savepoint(tx, "RELEASE SAVEPOINT release_parked").await?;
                let identity = decoded.as_ref().ok().map(|e| (&e.key, e.event_type.as_str()));
                let letter = letters::letter(key.subscription, &msg, identity, &reason, 1);
                if !dead_letter::insert(tx, &letter).await? {
                    // A letter holds this position already, so parking it was
                    // wrong; stop rather than leave the key blocked by nothing.
                    return Err(HandlerError::Reject(format!("parked record at offset {} has a dead letter already", next.offset)));
                }
                letters::log_dead(&letter);
                released.dead_lettered = Some(next.offset);
            }
            Err(retryable) => return Err(retryable),
        }
        parked::remove(tx, key, next.offset).await?;
        if released.dead_lettered.is_some() {
            break;
        }
    }
    released.still_parked = parked::count_key(tx, key).await?;
    Ok(released)
}

async fn savepoint(tx: &mut Tx<'_>, sql: &str) -> Result<(), StoreError> {
    sqlx::query(sql).execute(&mut **tx).await?;
    Ok(())
}

/// The parked record, rebuilt as it was read from Kafka.
fn message_of(p: &Parked) -> OwnedMessage {
    message(&p.topic, p.partition, p.offset, Some(&p.record_key), &p.headers, p.value.as_deref())
}

/// A record as it was read from Kafka, from what a dead letter or a parked
/// record keeps of it.
pub(crate) fn message(
    topic: &str,
    partition: i32,
    offset: i64,
    key: Option<&[u8]>,
    headers: &[(String, Option<Vec<u8>>)],
    value: Option<&[u8]>,
) -> OwnedMessage {
    let mut owned = OwnedHeaders::new_with_capacity(headers.len());
    for (name, value) in headers {
        owned = owned.insert(Header { key: name, value: value.as_deref() });
    }
    OwnedMessage::new(
        value.map(<[u8]>::to_vec),
        key.map(<[u8]>::to_vec),
        topic.to_owned(),
        Timestamp::NotAvailable,
        partition,
        offset,
        Some(owned),
    )
}
