//! Redrive: a dead letter goes through the same decode, inbox and handler as
//! live records, in one transaction that also marks it redriven. A fact the
//! inbox has already applied (redriven before, or redelivered and applied
//! meanwhile) is not applied again.
//!
//! A letter of a [`Processor`] (the export worker) goes back through the
//! processor itself; its effects span more than one transaction (an attempt
//! starts, writes an artifact, completes), so the letter is marked after the
//! processor returned, and the processor's own dedup absorbs the second run
//! that a crash in between leads to.

use herald_envelope::{Registry, decode_any_with};
use herald_store::dead_letter::{self, DeadLetter};
use herald_store::inbox::{self, Delivery, Entry};
use herald_store::{Db, StoreError};
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};

use crate::{Handler, HandlerError, ProcessError, Processed, Processor, Record};

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
    /// Not dead any more (already redriven).
    NotDead,
}

/// The dead letter's record, rebuilt as it was read from Kafka.
pub fn record_of(letter: &DeadLetter) -> OwnedMessage {
    let mut headers = OwnedHeaders::new_with_capacity(letter.headers.len());
    for (key, value) in &letter.headers {
        headers = headers.insert(Header { key, value: value.as_deref() });
    }
    OwnedMessage::new(
        letter.value.clone(),
        letter.record_key.clone(),
        letter.topic.clone(),
        Timestamp::NotAvailable,
        letter.partition,
        letter.offset,
        Some(headers),
    )
}

/// Redrives one dead letter of `handler`'s subscription, decoding with the
/// schemas compiled into this build.
pub async fn redrive<H: Handler>(db: &Db, handler: &H, letter: &DeadLetter) -> Result<Redriven, StoreError> {
    redrive_with(db, handler, &Registry::embedded(), letter).await
}

/// Redrives one dead letter with the writer schemas of `registry`: a letter
/// set aside as `unknown schema <file>` applies once `registry` has the file.
pub async fn redrive_with<H: Handler>(db: &Db, handler: &H, registry: &Registry, letter: &DeadLetter) -> Result<Redriven, StoreError> {
    if letter.status != dead_letter::DEAD {
        return Ok(Redriven::NotDead);
    }
    let record = record_of(letter);
    let event = match decode_any_with(&record, registry) {
        Ok(event) => event,
        Err(e) => return failed(db, letter, e.to_string()).await,
    };
    let outcome = async {
        let mut tx = db.begin().await?;
        if !dead_letter::mark_redriven(&mut tx, letter.id).await? {
            return Ok(Redriven::NotDead);
        }
        let outcome = if !handler.handles(&event.event_type) {
            Redriven::NotHandled
        } else {
            let delivery = Delivery { topic: &letter.topic, partition: letter.partition, offset: letter.offset };
            let entry = Entry { key: &event.key, event_type: &event.event_type, delivery };
            if inbox::claim_batch(&mut tx, &letter.subscription, &[entry]).await?.is_empty() {
                Redriven::AlreadyApplied
            } else {
                handler.apply(&mut tx, &[Record { event: &event, partition: letter.partition, offset: letter.offset }]).await?;
                Redriven::Applied
            }
        };
        tx.commit().await.map_err(StoreError::from)?;
        Ok::<_, HandlerError>(outcome)
    }
    .await;
    match outcome {
        Ok(done) => Ok(done),
        Err(HandlerError::Reject(reason)) => failed(db, letter, reason).await,
        Err(HandlerError::Retryable(reason)) => Ok(Redriven::Failed(format!("retryable, try again: {reason}"))),
    }
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
