//! Projections: read models kept in generations and fed by one engine from
//! two sources — live traffic ([`Live`], a subscription's consumer group)
//! and the replay of retained history into one new generation
//! ([`crate::replay`]). A generation owns records by offset, per partition:
//! below its boundary they are the replay's, at or above it live traffic's
//! (see `herald_store::positions` for why no record is applied by both).
//!
//! A projection writes only its own tables, so replaying history into it
//! cannot cause an effect outside the database. Notification code does not
//! implement this trait and the rebuild accepts nothing else.

use std::future::Future;

use herald_envelope::DecodedEvent;
use herald_store::delivered::Settled;
use herald_store::generations::{self, LiveGeneration};
use herald_store::{Db, StoreError, Tx};
use sqlx::PgConnection;

use crate::handler::{Handler, Record, WritePath};
use crate::{HandlerError, Order};

/// What a generation holds, to compare two generations read in one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    /// Rows reads can find (documents, counters).
    pub rows: i64,
    /// What else is kept (tombstones), for the report.
    pub other: i64,
    pub checksum: String,
}

/// A fact a replay loads, with its record's offset in its partition: the
/// order in which the replay met it there, which a projection that settles
/// a job loaded twice only at the seal (search) needs for the version
/// guard's tie rule.
#[derive(Debug)]
pub struct Arrived<'a, F> {
    pub offset: i64,
    pub fact: &'a F,
}

impl<'a, F> Arrived<'a, F> {
    /// The facts alone, for a write that needs no offsets.
    pub fn facts(arrived: &[Self]) -> Vec<&'a F> {
        arrived.iter().map(|a| a.fact).collect()
    }
}

/// A read model that can be rebuilt.
pub trait Projection: Send + Sync + 'static {
    /// Its name in `projection_generations`, its live subscription, and the
    /// prefix of its replays' dedup scopes (`<name>@g<N>`).
    const NAME: &'static str;
    /// Applying an event twice to a generation changes nothing (versioned
    /// upserts): its replays keep no inbox rows. Counters say `false`.
    const IDEMPOTENT: bool;
    /// Whether [`Projection::write_pg`] is implemented: a replay on
    /// PostgreSQL then writes through sqlx's native driver with array binds.
    const WRITES_PG: bool = false;
    /// Whether its live subscription keeps per-key order past a dead letter
    /// ([`Handler::order`]). A replay applies history in order and skips
    /// what it cannot apply, so it does not park.
    const ORDER: Order = Order::None;

    /// What it learns from one event, decoded once: on the replay's reader
    /// thread (the CPU work), or in the live batch.
    type Fact: Send + Sync + 'static;

    /// Event types it applies; the others only move positions.
    fn handles(event_type: &str) -> bool;

    /// The fact `event` (of a handled type) carries. An error is permanent:
    /// the live subscription dead-letters the record, a replay skips it.
    fn fact(event: &DecodedEvent) -> Result<Self::Fact, HandlerError>;

    /// Writes `facts` — of events first seen for `generation`, in offset
    /// order per partition — into `generation`.
    fn write(&self, tx: &mut Tx<'_>, generation: i64, facts: &[&Self::Fact]) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// The same as [`Projection::write`] on a native PostgreSQL connection,
    /// rows already there met as `path` says ([`WritePath::Plain`]: fail
    /// with [`HandlerError::Conflict`]). `storage`: the table holding the
    /// generation's rows, as [`Projection::seal_load`] returned it (live
    /// writes; a replay passes `None`). Check it is one of yours before
    /// naming it in SQL.
    fn write_pg(
        &self,
        tx: &mut PgConnection,
        generation: i64,
        storage: Option<&str>,
        facts: &[&Self::Fact],
        path: WritePath,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        let _ = (tx, generation, storage, facts, path);
        async { Err(HandlerError::Reject(format!("projection {} has no PostgreSQL fast path", Self::NAME))) }
    }

    /// A replay's write on PostgreSQL into the generation it is loading
    /// (after [`Projection::prepare_load`]), each fact with its record's
    /// offset; by default [`Projection::write_pg`]. Search appends to a
    /// table of the generation's own without a key, and settles a job
    /// loaded twice by version and then offset when
    /// [`Projection::seal_load`] builds its key.
    fn load_pg(
        &self,
        tx: &mut PgConnection,
        generation: i64,
        facts: &[Arrived<'_, Self::Fact>],
        path: WritePath,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        let facts = Arrived::facts(facts);
        async move { self.write_pg(tx, generation, None, &facts, path).await }
    }

    /// Before a replay writes `generation`: makes ready where
    /// [`Projection::load_pg`] writes. Runs again when a replay resumes.
    fn prepare_load(&self, db: &Db, generation: i64) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (db, generation);
        async { Ok(()) }
    }

    /// After the replay reached the boundary and before the generation is
    /// verified: makes what it loaded readable with what live traffic wrote
    /// into the generation meanwhile. Runs again when a rebuild that stopped
    /// after the replay resumes, so a second run must change nothing.
    /// `Some(table)`: the generation's rows are now in a table of their own,
    /// which live writes are given as their `storage` from then on.
    fn seal_load(&self, db: &Db, generation: i64) -> impl Future<Output = Result<Option<String>, StoreError>> + Send {
        let _ = (db, generation);
        async { Ok(None) }
    }

    /// What `generation` holds, read in `tx` (a snapshot shared with the
    /// generation it is compared with).
    fn fingerprint(&self, tx: &mut Tx<'_>, generation: i64) -> impl Future<Output = Result<Fingerprint, StoreError>> + Send;

    /// Checks `generation` against the projection's own source of truth, for
    /// rebuilds that cannot compare with a live generation (offline).
    /// `settled`: which outbox rows were surely in Kafka below the
    /// generation's boundary (delivered before it was read);
    /// [`Settled::outbox_filter`] says it in SQL. `None`: the projection
    /// declares no source of truth. `Some(problems)`: empty when the
    /// generation agrees.
    fn verify_source(
        &self,
        db: &Db,
        generation: i64,
        settled: &Settled,
    ) -> impl Future<Output = Result<Option<Vec<String>>, StoreError>> + Send {
        let _ = (db, generation, settled);
        async { Ok(None) }
    }
}

/// A projection fed by live traffic: each batch goes to every generation in
/// a live state, each record only to the generations that own its offset.
pub struct Live<P> {
    projection: P,
    topic: String,
}

impl<P: Projection> Live<P> {
    /// `topic`: the one topic the subscription reads (boundaries are kept per topic).
    pub fn new(projection: P, topic: &str) -> Live<P> {
        Live { projection, topic: topic.to_owned() }
    }
}

impl<P: Projection> Handler for Live<P> {
    fn handles(&self, event_type: &str) -> bool {
        P::handles(event_type)
    }

    fn order(&self) -> Order {
        P::ORDER
    }

    async fn apply(&self, tx: &mut Tx<'_>, records: &[Record<'_>]) -> Result<(), HandlerError> {
        let facts = facts::<P>(records)?;
        for generation in generations::live(tx, P::NAME, &self.topic).await? {
            let owned = owned_by(&generation, &facts);
            if !owned.is_empty() {
                self.projection.write(tx, generation.generation, &owned).await?;
            }
        }
        Ok(())
    }

    fn applies_pg(&self) -> bool {
        P::WRITES_PG
    }

    async fn apply_pg(&self, tx: &mut PgConnection, records: &[Record<'_>], path: WritePath) -> Result<(), HandlerError> {
        let facts = facts::<P>(records)?;
        for generation in generations::live_pg(tx, P::NAME, &self.topic).await.map_err(StoreError::from)? {
            let owned = owned_by(&generation, &facts);
            if !owned.is_empty() {
                self.projection.write_pg(tx, generation.generation, generation.storage.as_deref(), &owned, path).await?;
            }
        }
        Ok(())
    }
}

fn facts<'r, P: Projection>(records: &'r [Record<'r>]) -> Result<Vec<(&'r Record<'r>, P::Fact)>, HandlerError> {
    records.iter().map(|r| Ok((r, P::fact(r.event)?))).collect()
}

/// The facts of records `generation` takes from live traffic.
fn owned_by<'f, F>(generation: &LiveGeneration, facts: &'f [(&Record<'_>, F)]) -> Vec<&'f F> {
    facts.iter().filter(|(r, _)| generation.owns(r.partition, r.offset)).map(|(_, f)| f).collect()
}
