//! The generations of a projection and the transactions that open them and
//! move reads between them. States, positions and what live traffic reads
//! are the engine's (`herald_store::generations`, re-exported here).

use std::collections::BTreeMap;

use herald_projections::search::{self, DocumentRow};
use herald_store::delivered::Settled;
use herald_store::{Db, StoreError, now_ms, positions};
use serde::Serialize;
use sqlx::Row;
use sqlx::any::AnyRow;

pub use herald_store::generations::{
    ACTIVE, ARCHIVED, BUILDING, CATCHING_UP, FAILED, LIVE_STATES, Position, READY, RETIRED, active, advance, positions,
};

use crate::RebuildError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Generation {
    pub projection: String,
    pub generation: i64,
    pub state: String,
    pub documents: Option<i64>,
    pub checksum: Option<String>,
    pub detail: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub switched_at_ms: Option<i64>,
    /// `live` or `offline` (see [`Boundary`]); none for generations opened
    /// before boundaries were kept.
    pub boundary_mode: Option<String>,
    /// Offline: the database time before the topic's end was read.
    pub settled_before_ms: Option<i64>,
    /// Offline: the relay's cursors read then (JSON of [`Settled`]'s); none
    /// for generations opened by releases before v0.11.0.
    pub settled_cursors: Option<String>,
}

impl Generation {
    /// Offline: what was surely delivered before the boundary was read.
    pub fn settled(&self) -> Option<Settled> {
        let before_ms = self.settled_before_ms?;
        // Unreadable or absent cursors leave only the rows an older relay
        // dated: fewer facts checked, never a fact wrongly required.
        let cursors = self.settled_cursors.as_deref().and_then(|c| serde_json::from_str(c).ok()).unwrap_or_default();
        Some(Settled { before_ms, cursors })
    }
}

const COLUMNS: &str = "projection, generation, state, documents, checksum, detail, created_at_ms, updated_at_ms, switched_at_ms, \
     boundary_mode, settled_before_ms, settled_cursors";

fn row_to_generation(row: &AnyRow) -> Result<Generation, StoreError> {
    Ok(Generation {
        projection: row.try_get("projection")?,
        generation: row.try_get("generation")?,
        state: row.try_get("state")?,
        documents: row.try_get("documents")?,
        checksum: row.try_get("checksum")?,
        detail: row.try_get("detail")?,
        created_at_ms: row.try_get("created_at_ms")?,
        updated_at_ms: row.try_get("updated_at_ms")?,
        switched_at_ms: row.try_get("switched_at_ms")?,
        boundary_mode: row.try_get("boundary_mode")?,
        settled_before_ms: row.try_get("settled_before_ms")?,
        settled_cursors: row.try_get("settled_cursors")?,
    })
}

/// Makes `projection` known with generation 1 active, unless it is: what a
/// projection of your own needs once (Herald's own get it from migrations).
pub async fn register(db: &Db, projection: &str) -> Result<(), StoreError> {
    let mut tx = db.begin().await?;
    sqlx::query("INSERT INTO active_generations (projection, generation) VALUES ($1, 1) ON CONFLICT (projection) DO NOTHING")
        .bind(projection)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO projection_generations (projection, generation, state, created_at_ms, updated_at_ms) VALUES ($1, 1, $2, $3, $3) \
         ON CONFLICT (projection, generation) DO NOTHING",
    )
    .bind(projection)
    .bind(ACTIVE)
    .bind(now_ms())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Every generation of `projection`, newest first.
pub async fn list(db: &Db, projection: &str) -> Result<Vec<Generation>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM projection_generations WHERE projection = $1 ORDER BY generation DESC");
    let rows = sqlx::query(&sql).bind(projection).fetch_all(db.pool()).await?;
    rows.iter().map(row_to_generation).collect()
}

pub async fn in_state(db: &Db, projection: &str, states: &[&str]) -> Result<Option<Generation>, StoreError> {
    Ok(list(db, projection).await?.into_iter().find(|g| states.contains(&g.state.as_str())))
}

/// Where a new generation's replay ends and live traffic's part begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Boundary {
    /// Where live traffic stands: replay what it has applied, live traffic
    /// writes the rest. Nothing to wait for.
    Live,
    /// At least the end of the topic (the high watermarks given, read after
    /// `settled` was taken): replay everything there is; live traffic, when
    /// it resumes, writes only what is past it. For a live subscription that
    /// is stopped or far behind.
    Offline { settled: Settled },
}

impl Boundary {
    pub fn mode(&self) -> &'static str {
        match self {
            Boundary::Live => "live",
            Boundary::Offline { .. } => "offline",
        }
    }
}

/// Opens generation N+1 in `building` in one transaction: its start per
/// partition (`starts`: `next_offset` where the replay begins, the high
/// watermark in `boundary_offset`), its boundaries, the history it needs
/// and the documents of a snapshot it starts from. The live subscription's
/// positions are locked while the boundaries are set from them, so every
/// record is the replay's (below) or live traffic's (at or above), never
/// both and never neither (see `herald_store::positions`).
pub async fn open_next(
    db: &Db,
    projection: &str,
    topic: &str,
    starts: &[Position],
    boundary: Boundary,
    documents: &[DocumentRow],
) -> Result<(Generation, Vec<Position>), StoreError> {
    let now = now_ms();
    let mut tx = db.begin().await?;
    let partitions: Vec<i32> = starts.iter().map(|p| p.partition).collect();
    // A projection's live subscription bears its name.
    let live: BTreeMap<i32, i64> = positions::lock(db, &mut tx, projection, topic, &partitions).await?;
    let positions: Vec<Position> = starts
        .iter()
        .map(|p| {
            let live = live.get(&p.partition).copied().unwrap_or(0);
            let boundary_offset = match &boundary {
                Boundary::Live => live,
                Boundary::Offline { .. } => live.max(p.boundary_offset),
            };
            Position { partition: p.partition, next_offset: p.next_offset, boundary_offset }
        })
        .collect();
    let next: i64 = sqlx::query("SELECT COALESCE(MAX(generation), 0) + 1 AS n FROM projection_generations WHERE projection = $1")
        .bind(projection)
        .fetch_one(&mut *tx)
        .await?
        .try_get("n")?;
    let (settled, cursors) = match &boundary {
        Boundary::Live => (None, None),
        Boundary::Offline { settled } => {
            let cursors = serde_json::to_string(&settled.cursors).map_err(|e| StoreError::Query(sqlx::Error::Encode(Box::new(e))))?;
            (Some(settled.before_ms), Some(cursors))
        }
    };
    sqlx::query(
        "INSERT INTO projection_generations (projection, generation, state, created_at_ms, updated_at_ms, boundary_mode, \
         settled_before_ms, settled_cursors) VALUES ($1, $2, $3, $4, $4, $5, $6, $7)",
    )
    .bind(projection)
    .bind(next)
    .bind(BUILDING)
    .bind(now)
    .bind(boundary.mode())
    .bind(settled)
    .bind(cursors)
    .execute(&mut *tx)
    .await?;
    herald_store::generations::insert_positions(&mut tx, projection, next, topic, &positions).await?;
    let history: Vec<(i32, i64)> = positions.iter().map(|p| (p.partition, p.next_offset)).collect();
    crate::history::record(&mut tx, projection, next, topic, &history).await?;
    for chunk in documents.chunks(10_000) {
        search::upsert_rows(&mut tx, next, chunk).await?;
    }
    tx.commit().await?;
    let generation = list(db, projection).await?.into_iter().find(|g| g.generation == next).expect("just created");
    Ok((generation, positions))
}

pub async fn set_state(db: &Db, projection: &str, generation: i64, state: &str, detail: Option<&str>) -> Result<(), StoreError> {
    sqlx::query("UPDATE projection_generations SET state = $1, detail = $2, updated_at_ms = $3 WHERE projection = $4 AND generation = $5")
        .bind(state)
        .bind(detail)
        .bind(now_ms())
        .bind(projection)
        .bind(generation)
        .execute(db.pool())
        .await?;
    Ok(())
}

/// Records the table now holding `generation`'s rows (what
/// `Projection::seal_load` returned), so live writes name it instead of
/// going through the table it belongs to. A hint only: a write that read
/// none still lands where the database routes it.
pub async fn record_storage(db: &Db, projection: &str, generation: i64, storage: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE projection_generations SET storage = $1, updated_at_ms = $2 WHERE projection = $3 AND generation = $4")
        .bind(storage)
        .bind(now_ms())
        .bind(projection)
        .bind(generation)
        .execute(db.pool())
        .await?;
    Ok(())
}

pub async fn record_verification(db: &Db, projection: &str, generation: i64, documents: i64, checksum: &str) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE projection_generations SET state = $1, documents = $2, checksum = $3, detail = NULL, updated_at_ms = $4 \
         WHERE projection = $5 AND generation = $6",
    )
    .bind(READY)
    .bind(documents)
    .bind(checksum)
    .bind(now_ms())
    .bind(projection)
    .bind(generation)
    .execute(db.pool())
    .await?;
    Ok(())
}

/// Moves reads to `generation` (which must be `ready` or `retired`) in one
/// transaction: the active one becomes the rollback target (`retired`), an
/// older rollback target is archived, and `active_generations` names the
/// new one. A reader sees either the old generation or the new one, whole.
pub async fn switch_to(db: &Db, projection: &str, generation: i64) -> Result<(), RebuildError> {
    let now = now_ms();
    let mut tx = db.begin().await?;
    let target: Option<String> = sqlx::query("SELECT state FROM projection_generations WHERE projection = $1 AND generation = $2")
        .bind(projection)
        .bind(generation)
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::from)?
        .map(|r| r.try_get("state"))
        .transpose()
        .map_err(StoreError::from)?;
    match target.as_deref() {
        Some(READY | RETIRED) => {}
        Some(other) => return Err(RebuildError::State(format!("generation {generation} is {other}, not ready"))),
        None => return Err(RebuildError::State(format!("no generation {generation}"))),
    }
    let run = |sql: &'static str, a: &'static str, b: &'static str| sqlx::query(sql).bind(a).bind(now).bind(projection).bind(b);
    run("UPDATE projection_generations SET state = $1, updated_at_ms = $2 WHERE projection = $3 AND state = $4", ARCHIVED, RETIRED)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::from)?;
    run("UPDATE projection_generations SET state = $1, updated_at_ms = $2 WHERE projection = $3 AND state = $4", RETIRED, ACTIVE)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::from)?;
    sqlx::query(
        "UPDATE projection_generations SET state = $1, switched_at_ms = $2, updated_at_ms = $2 WHERE projection = $3 AND generation = $4",
    )
    .bind(ACTIVE)
    .bind(now)
    .bind(projection)
    .bind(generation)
    .execute(&mut *tx)
    .await
    .map_err(StoreError::from)?;
    sqlx::query("UPDATE active_generations SET generation = $1 WHERE projection = $2")
        .bind(generation)
        .bind(projection)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::from)?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(())
}

/// Returns reads to the rollback target (the `retired` generation).
pub async fn rollback(db: &Db, projection: &str) -> Result<i64, RebuildError> {
    let Some(previous) = in_state(db, projection, &[RETIRED]).await? else {
        return Err(RebuildError::State(format!("{projection} has no retired generation to roll back to")));
    };
    switch_to(db, projection, previous.generation).await?;
    Ok(previous.generation)
}
