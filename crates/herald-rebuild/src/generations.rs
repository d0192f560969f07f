//! The generations of a projection and the transactions that move reads
//! between them.

use herald_projections::search::{self, DocumentRow};
use herald_store::{Db, StoreError, Tx, now_ms};
use serde::Serialize;
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::RebuildError;

pub const BUILDING: &str = "building";
pub const CATCHING_UP: &str = "catching_up";
pub const READY: &str = "ready";
pub const ACTIVE: &str = "active";
/// The previous active generation: still written live, the rollback target.
pub const RETIRED: &str = "retired";
/// Older than the rollback target: no longer written, may be dropped.
pub const ARCHIVED: &str = "archived";
pub const FAILED: &str = "failed";

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
}

/// A generation's read position in one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Position {
    pub partition: i32,
    pub next_offset: i64,
    pub boundary_offset: i64,
}

impl Position {
    pub fn done(&self) -> bool {
        self.next_offset >= self.boundary_offset
    }
}

const COLUMNS: &str = "projection, generation, state, documents, checksum, detail, created_at_ms, updated_at_ms, switched_at_ms";

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
    })
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

/// Creates generation N+1 in `building`, with its boundary and start offsets
/// per partition, the history it needs (its start offsets) and the
/// documents of a snapshot it starts from, in one transaction: from its
/// commit on, live traffic writes it too, and everything between the starts
/// and the boundary is the replay's.
pub async fn create_next(db: &Db, projection: &str, topic: &str, positions: &[Position], documents: &[DocumentRow]) -> Result<Generation, StoreError> {
    let now = now_ms();
    let mut tx = db.begin().await?;
    let next: i64 = sqlx::query("SELECT COALESCE(MAX(generation), 0) + 1 AS n FROM projection_generations WHERE projection = $1")
        .bind(projection)
        .fetch_one(&mut *tx)
        .await?
        .try_get("n")?;
    sqlx::query(
        "INSERT INTO projection_generations (projection, generation, state, created_at_ms, updated_at_ms) VALUES ($1, $2, $3, $4, $4)",
    )
    .bind(projection)
    .bind(next)
    .bind(BUILDING)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    for p in positions {
        sqlx::query(
            "INSERT INTO generation_positions (projection, generation, topic, kafka_partition, next_offset, boundary_offset) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(projection)
        .bind(next)
        .bind(topic)
        .bind(p.partition)
        .bind(p.next_offset)
        .bind(p.boundary_offset)
        .execute(&mut *tx)
        .await?;
    }
    let starts: Vec<(i32, i64)> = positions.iter().map(|p| (p.partition, p.next_offset)).collect();
    crate::history::record(&mut tx, projection, next, topic, &starts).await?;
    for chunk in documents.chunks(10_000) {
        search::upsert_rows(&mut tx, next, chunk).await?;
    }
    tx.commit().await?;
    Ok(list(db, projection).await?.into_iter().find(|g| g.generation == next).expect("just created"))
}

pub async fn positions(db: &Db, projection: &str, generation: i64) -> Result<Vec<Position>, StoreError> {
    let rows = sqlx::query(
        "SELECT kafka_partition, next_offset, boundary_offset FROM generation_positions \
         WHERE projection = $1 AND generation = $2 ORDER BY kafka_partition",
    )
    .bind(projection)
    .bind(generation)
    .fetch_all(db.pool())
    .await?;
    rows.iter()
        .map(|r| Ok(Position { partition: r.try_get("kafka_partition")?, next_offset: r.try_get("next_offset")?, boundary_offset: r.try_get("boundary_offset")? }))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// Advances a position inside the replay's transaction, so the documents and
/// the position that produced them commit together: a rebuild killed at any
/// point resumes exactly after what it applied.
pub async fn advance(tx: &mut Tx<'_>, projection: &str, generation: i64, partition: i32, next_offset: i64) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE generation_positions SET next_offset = $1 WHERE projection = $2 AND generation = $3 AND kafka_partition = $4 \
         AND next_offset < $1",
    )
    .bind(next_offset)
    .bind(projection)
    .bind(generation)
    .bind(partition)
    .execute(&mut **tx)
    .await?;
    Ok(())
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
    let run = |sql: &'static str, a: &'static str, b: &'static str| {
        sqlx::query(sql).bind(a).bind(now).bind(projection).bind(b)
    };
    run("UPDATE projection_generations SET state = $1, updated_at_ms = $2 WHERE projection = $3 AND state = $4", ARCHIVED, RETIRED)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::from)?;
    run("UPDATE projection_generations SET state = $1, updated_at_ms = $2 WHERE projection = $3 AND state = $4", RETIRED, ACTIVE)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::from)?;
    sqlx::query("UPDATE projection_generations SET state = $1, switched_at_ms = $2, updated_at_ms = $2 WHERE projection = $3 AND generation = $4")
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

pub async fn active(db: &Db, projection: &str) -> Result<i64, StoreError> {
    Ok(sqlx::query("SELECT generation FROM active_generations WHERE projection = $1")
        .bind(projection)
        .fetch_one(db.pool())
        .await?
        .try_get("generation")?)
}
