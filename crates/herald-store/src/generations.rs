//! What the projection engine needs of `projection_generations` and
//! `generation_positions`: the states (defined here once), which
//! generations live traffic writes and from which offset on, and a
//! replay's positions (every write of `generation_positions`, its owner
//! being this crate: the positions a rebuild opens with, the replay's
//! advance). Creating, verifying and switching generations is the rebuild's
//! (`herald_rebuild::generations`).

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::Row;

use crate::{Db, StoreError, Tx};

pub const BUILDING: &str = "building";
/// A replay finished and live traffic is catching up (generations created
/// before boundaries came from the live positions; still written live).
pub const CATCHING_UP: &str = "catching_up";
pub const READY: &str = "ready";
pub const ACTIVE: &str = "active";
/// The previous active generation: still written live, the rollback target.
pub const RETIRED: &str = "retired";
/// Older than the rollback target: no longer written, may be dropped.
pub const ARCHIVED: &str = "archived";
pub const FAILED: &str = "failed";

/// States whose generations receive live writes. `archived` and `failed`
/// ones do not.
pub const LIVE_STATES: [&str; 5] = [BUILDING, CATCHING_UP, READY, ACTIVE, RETIRED];

/// `state IN (…live states…)` for SQL, the states inlined (constants, not input).
pub fn live_states_sql() -> String {
    let quoted: Vec<String> = LIVE_STATES.iter().map(|s| format!("'{s}'")).collect();
    format!("state IN ({})", quoted.join(", "))
}

/// A generation's read position in one partition: the replay applies
/// `[next_offset, boundary_offset)`, live traffic everything from
/// `boundary_offset` on.
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

/// A generation live traffic writes, and from which offset on per
/// partition: a partition it has no boundary for is live's from offset 0
/// (a generation that was never rebuilt, or a partition added since).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveGeneration {
    pub generation: i64,
    pub boundaries: BTreeMap<i32, i64>,
    /// The table holding the generation's rows, when its projection keeps
    /// one per generation and recorded it (`projection_generations.storage`).
    pub storage: Option<String>,
}

impl LiveGeneration {
    /// Whether live traffic applies the record at `offset` of `partition` here.
    pub fn owns(&self, partition: i32, offset: i64) -> bool {
        offset >= self.boundaries.get(&partition).copied().unwrap_or(0)
    }
}

/// The generations of `projection` that live traffic writes, with their
/// boundaries in `topic`, read inside the batch's transaction.
pub async fn live(tx: &mut Tx<'_>, projection: &str, topic: &str) -> Result<Vec<LiveGeneration>, StoreError> {
    let rows: Vec<LiveRow> = sqlx::query_as(&live_sql()).bind(projection).bind(topic).fetch_all(&mut **tx).await?;
    Ok(fold_live(rows))
}

/// [`live`] on sqlx's native PostgreSQL driver (a live batch's fast path).
pub async fn live_pg(conn: &mut sqlx::PgConnection, projection: &str, topic: &str) -> Result<Vec<LiveGeneration>, sqlx::Error> {
    let rows: Vec<LiveRow> = sqlx::query_as(&live_sql()).bind(projection).bind(topic).fetch_all(conn).await?;
    Ok(fold_live(rows))
}

/// (generation, storage, partition, boundary), the partition's columns null
/// for a generation without positions in the topic.
type LiveRow = (i64, Option<String>, Option<i32>, Option<i64>);

fn live_sql() -> String {
    format!(
        "SELECT g.generation, g.storage, p.kafka_partition, p.boundary_offset FROM projection_generations g \
         LEFT JOIN generation_positions p ON p.projection = g.projection AND p.generation = g.generation AND p.topic = $2 \
         WHERE g.projection = $1 AND g.{} ORDER BY g.generation",
        live_states_sql()
    )
}

fn fold_live(rows: Vec<LiveRow>) -> Vec<LiveGeneration> {
    let mut out: Vec<LiveGeneration> = Vec::new();
    for (generation, storage, partition, boundary) in rows {
        if out.last().is_none_or(|g| g.generation != generation) {
            out.push(LiveGeneration { generation, boundaries: BTreeMap::new(), storage });
        }
        if let (Some(partition), Some(boundary), Some(last)) = (partition, boundary, out.last_mut()) {
            last.boundaries.insert(partition, boundary);
        }
    }
    out
}

/// A generation's replay positions, by partition.
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
        .map(|r| {
            Ok(Position {
                partition: r.try_get("kafka_partition")?,
                next_offset: r.try_get("next_offset")?,
                boundary_offset: r.try_get("boundary_offset")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// Records a new generation's replay positions in `topic`, inside the
/// transaction that opens it (`herald_rebuild::generations::open_next`).
pub async fn insert_positions(
    tx: &mut Tx<'_>,
    projection: &str,
    generation: i64,
    topic: &str,
    positions: &[Position],
) -> Result<(), StoreError> {
    for p in positions {
        sqlx::query(
            "INSERT INTO generation_positions (projection, generation, topic, kafka_partition, next_offset, boundary_offset) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(projection)
        .bind(generation)
        .bind(topic)
        .bind(p.partition)
        .bind(p.next_offset)
        .bind(p.boundary_offset)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// Advances a replay position inside the replay's transaction, so what it
/// wrote and the position that produced it commit together: a rebuild
/// killed at any point resumes exactly after what it applied.
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

/// The generation reads go to.
pub async fn active(db: &Db, projection: &str) -> Result<i64, StoreError> {
    Ok(sqlx::query("SELECT generation FROM active_generations WHERE projection = $1")
        .bind(projection)
        .fetch_one(db.pool())
        .await?
        .try_get("generation")?)
}

/// [`advance`] for a replay on sqlx's native PostgreSQL driver: every
/// partition of the batch in one statement.
pub async fn advance_pg(
    conn: &mut sqlx::PgConnection,
    projection: &str,
    generation: i64,
    next: &BTreeMap<i32, i64>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE generation_positions SET next_offset = u.n FROM UNNEST($1::int4[], $2::int8[]) AS u(p, n) \
         WHERE projection = $3 AND generation = $4 AND kafka_partition = u.p AND next_offset < u.n",
    )
    .bind(next.keys().copied().collect::<Vec<i32>>())
    .bind(next.values().copied().collect::<Vec<i64>>())
    .bind(projection)
    .bind(generation)
    .execute(conn)
    .await?;
    Ok(())
}
