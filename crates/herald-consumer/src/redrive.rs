//! Redrive: a dead letter goes through the same decode, inbox and handler as
//! live records, in one transaction that also marks it redriven. A fact the
//! inbox has already applied (redriven before, or redelivered and applied
//! meanwhile) is not applied again. Discard: an operator gives up on a
//! letter. Either way, the same transaction releases the records parked
//! behind the letter's key (per-key order, `parking`), in offset order.
//!
//! A letter of a [`Processor`] (the export worker) goes back through the
//! processor itself; its effects span more than one transaction (an attempt
//! starts, writes an artifact, completes), so the letter is marked after the
//! processor returned, and the processor's own dedup absorbs the second run
//! that a crash in between leads to.

use herald_envelope::{Registry, decode_any_with};
use herald_store::dead_letter::{self, DeadLetter};
use herald_store::parked::KeyRef;
use herald_store::{Db, StoreError, Tx, positions};
use rdkafka::message::OwnedMessage;

use crate::parking::{self, Outcome, Released};
use crate::{Handler, HandlerError, ProcessError, Processed, Processor};

/// What a redrive did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redriven {
    /// The effect was applied now.
    Applied,
    /// The inbox had already applied this fact; nothing applied now.
    AlreadyApplied,
    /// The handler does not handle this event type; marked redriven.
    NotHandled,
    /// Still failing; the letter stays dead with this reason.
    Failed(String),
    /// Not dead any more (already redriven, or discarded).
    NotDead,
}

/// The dead letter's record, rebuilt as it was read from Kafka.
pub fn record_of(letter: &DeadLetter) -> OwnedMessage {
    parking::message(&letter.topic, letter.partition, letter.offset, letter.record_key.as_deref(), &letter.headers, letter.value.as_deref())
}

/// A redrive, and the release of the records parked behind its letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedriveOutcome {
    pub redriven: Redriven,
    /// Empty unless the letter left `dead` and its key had parked records.
    pub released: Released,
}

/// Redrives one dead letter of `handler`'s subscription, decoding with the
/// schemas compiled into this build.
pub async fn redrive<H: Handler>(db: &Db, handler: &H, letter: &DeadLetter) -> Result<Redriven, StoreError> {
    redrive_with(db, handler, &Registry::embedded(), letter).await
}

/// Redrives one dead letter with the writer schemas of `registry`: a letter
/// set aside as `unknown schema <file>` applies once `registry` has the file.
pub async fn redrive_with<H: Handler>(db: &Db, handler: &H, registry: &Registry, letter: &DeadLetter) -> Result<Redriven, StoreError> {
    Ok(redrive_releasing(db, handler, registry, letter).await?.redriven)
}

/// [`redrive_with`], saying what became of the records parked behind the
/// letter: the transaction that applies the letter also applies them, in
/// offset order, up to the first that fails (dead-lettered in turn).
pub async fn redrive_releasing<H: Handler>(
    db: &Db,
    handler: &H,
    registry: &Registry,
    letter: &DeadLetter,
) -> Result<RedriveOutcome, StoreError> {
    let outcome = |redriven| RedriveOutcome { redriven, released: Released::default() };
    if letter.status != dead_letter::DEAD {
        return Ok(outcome(Redriven::NotDead));
    }
    let record = record_of(letter);
    let event = match decode_any_with(&record, registry) {
        Ok(event) => event,
        Err(e) => return Ok(outcome(failed(db, letter, e.to_string()).await?)),
    };
    let done = async {
        let mut tx = db.begin().await?;
        positions::lock_partition(&mut tx, &letter.subscription, &letter.topic, letter.partition).await?;
        if !dead_letter::mark_redriven(&mut tx, letter.id).await? {
            return Ok(outcome(Redriven::NotDead));
        }
        let redriven = match parking::apply_one(&mut tx, handler, &letter.subscription, &record, &event).await? {
            Outcome::Applied => Redriven::Applied,
            Outcome::Duplicate => Redriven::AlreadyApplied,
            Outcome::NotHandled => Redriven::NotHandled,
        };
        let released = release_key(&mut tx, handler, registry, letter).await?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok::<_, HandlerError>(RedriveOutcome { redriven, released })
    }
    .await;
    match done {
        Ok(done) => Ok(done),
        Err(HandlerError::Reject(reason)) => Ok(outcome(failed(db, letter, reason).await?)),
        Err(HandlerError::Retryable(reason) | HandlerError::Conflict(reason)) => {
            Ok(outcome(Redriven::Failed(format!("retryable, try again: {reason}"))))
        }
    }
}

/// What discarding a dead letter did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discarded {
    /// Marked discarded; the records parked behind it were released.
    Discarded(Released),
    /// Not dead any more (redriven or discarded before).
    NotDead,
    /// Releasing the parked records failed (the database, retryably or
    /// not); nothing changed, the letter is still dead.
    Failed(String),
}

/// Discards one dead letter of `handler`'s subscription (an operator gave
/// up on its record: it is never applied) and, in the same transaction,
/// releases the records parked behind it as a redrive would.
pub async fn discard<H: Handler>(db: &Db, handler: &H, registry: &Registry, letter: &DeadLetter) -> Result<Discarded, StoreError> {
    if letter.status != dead_letter::DEAD {
        return Ok(Discarded::NotDead);
    }
    let done = async {
        let mut tx = db.begin().await?;
        positions::lock_partition(&mut tx, &letter.subscription, &letter.topic, letter.partition).await?;
        if !dead_letter::mark_discarded(&mut tx, letter.id).await? {
            return Ok(Discarded::NotDead);
        }
        let released = release_key(&mut tx, handler, registry, letter).await?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok::<_, HandlerError>(Discarded::Discarded(released))
    }
    .await;
    match done {
        Ok(done) => Ok(done),
        // A parked record that fails permanently becomes a letter inside
        // the release; a rejection reaching here is the store's own.
        Err(HandlerError::Reject(reason)) => Ok(Discarded::Failed(reason)),
        Err(HandlerError::Retryable(reason) | HandlerError::Conflict(reason)) => {
            Ok(Discarded::Failed(format!("retryable, try again: {reason}")))
        }
    }
}

/// Releases what is parked behind `letter`'s key (nothing for a keyless record).
async fn release_key<H: Handler>(tx: &mut Tx<'_>, handler: &H, registry: &Registry, letter: &DeadLetter) -> Result<Released, HandlerError> {
    let Some(record_key) = letter.record_key.as_deref() else { return Ok(Released::default()) };
    let key = KeyRef { subscription: &letter.subscription, topic: &letter.topic, partition: letter.partition, record_key };
    parking::release(tx, handler, registry, &key).await
}

/// Redrives one dead letter of `processor`'s subscription: the record as it
/// was read, handed to the processor again.
pub async fn redrive_processor<P: Processor>(db: &Db, processor: &P, letter: &DeadLetter) -> Result<Redriven, StoreError> {
    if letter.status != dead_letter::DEAD {
        return Ok(Redriven::NotDead);
    }
    let processed = match processor.process(&record_of(letter)).await {
        Ok(processed) => processed,
        Err(ProcessError::Permanent(reason)) => return failed(db, letter, reason).await,
        Err(ProcessError::Retryable(reason)) => return Ok(Redriven::Failed(format!("retryable, try again: {reason}"))),
    };
    let mut tx = db.begin().await?;
    let marked = dead_letter::mark_redriven(&mut tx, letter.id).await?;
    tx.commit().await?;
    Ok(match (marked, processed) {
        // Another redrive marked it first; the processor's dedup let only
        // one of the two runs change anything.
        (false, _) => Redriven::NotDead,
        (true, Processed::Applied) => Redriven::Applied,
        (true, Processed::Unchanged) => Redriven::AlreadyApplied,
        (true, Processed::Ignored) => Redriven::NotHandled,
    })
}

async fn failed(db: &Db, letter: &DeadLetter, reason: String) -> Result<Redriven, StoreError> {
    dead_letter::record_failed_redrive(db, letter.id, &reason).await?;
    Ok(Redriven::Failed(reason))
}
