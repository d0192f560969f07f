//! Snapshots: the active generation's documents (tombstones included) with
//! the per-partition positions they are consistent with, so a rebuild can
//! start from them when retention removed the history before those positions.
//!
//! Positions are the live group's committed offsets, read *before* the
//! documents: an offset is committed only after the transaction holding its
//! records' effects, so the documents read afterwards hold at least every
//! record before the positions (possibly a few after: replaying those again
//! is harmless — writes are idempotent and version-ordered).
//!
//! File format: one header line `{"format":…,"sha256":…}` then the body (one
//! JSON object). The checksum is over the body's exact bytes, so a truncated,
//! corrupted or edited file is refused. It detects accidents, not forgery:
//! whoever can write the file can recompute it — keep snapshots where only
//! operators write.

use herald_kafka::{KafkaConfig, offsets};
use herald_projections::search::DocumentRow;
use herald_store::{Backend, Db, StoreError, now_ms};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::{Projection, RebuildError, generations};

pub const FORMAT: &str = "herald-snapshot/1";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Header {
    format: String,
    sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotPosition {
    pub partition: i32,
    /// The next offset to replay: everything before it is in the documents.
    pub next_offset: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub projection: String,
    /// The generation it was taken from (information only).
    pub generation: i64,
    pub topic: String,
    pub created_at_ms: i64,
    pub positions: Vec<SnapshotPosition>,
    pub documents: Vec<DocumentRow>,
}

impl Snapshot {
    pub fn position(&self, partition: i32) -> Option<i64> {
        self.positions.iter().find(|p| p.partition == partition).map(|p| p.next_offset)
    }

    /// Header line, newline, body.
    pub fn encode(&self) -> Result<Vec<u8>, RebuildError> {
        let body = serde_json::to_vec(self).map_err(|e| RebuildError::Snapshot(format!("cannot encode: {e}")))?;
        let header = Header { format: FORMAT.to_owned(), sha256: hex(&body) };
        let mut out = serde_json::to_vec(&header).map_err(|e| RebuildError::Snapshot(format!("cannot encode: {e}")))?;
        out.push(b'\n');
        out.extend_from_slice(&body);
        out.push(b'\n');
        Ok(out)
    }

    /// Reads a file written by [`Snapshot::encode`]; refuses anything whose
    /// body does not match its checksum.
    pub fn decode(bytes: &[u8]) -> Result<Snapshot, RebuildError> {
        let bad = |m: String| RebuildError::Snapshot(m);
        let split = bytes.iter().position(|b| *b == b'\n').ok_or_else(|| bad("not a snapshot: no header line".into()))?;
        let header: Header = serde_json::from_slice(&bytes[..split]).map_err(|e| bad(format!("not a snapshot: header: {e}")))?;
        if header.format != FORMAT {
            return Err(bad(format!("unsupported snapshot format `{}` (expected {FORMAT})", header.format)));
        }
        let body = bytes[split + 1..].strip_suffix(b"\n").unwrap_or(&bytes[split + 1..]);
        let actual = hex(body);
        if actual != header.sha256 {
            return Err(bad(format!(
                "checksum mismatch: the file says {}, its content hashes to {actual}; the snapshot is corrupted or was altered",
                header.sha256
            )));
        }
        serde_json::from_slice(body).map_err(|e| bad(format!("body: {e}")))
    }
}

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Takes a snapshot of `P`'s active generation, consistent with the live
/// group's committed offsets on `topic`.
pub async fn take<P: Projection>(db: &Db, kafka: &KafkaConfig, live_group: &str, topic: &str) -> Result<Snapshot, RebuildError> {
    let states = offsets::partition_states(kafka, live_group, topic).await?;
    if states.is_empty() {
        return Err(RebuildError::Snapshot(format!("topic {topic} has no partitions (does it exist?)")));
    }
    let mut positions = Vec::with_capacity(states.len());
    for s in &states {
        let next_offset = match s.committed {
            Some(c) => c,
            // Nothing was ever there to apply.
            None if !s.has_records() => s.low,
            None => {
                return Err(RebuildError::Snapshot(format!(
                    "group {live_group} has no committed offset on {topic} partition {} (which holds records): \
                     is the live subscription running? a snapshot needs its position",
                    s.partition
                )));
            }
        };
        positions.push(SnapshotPosition { partition: s.partition, next_offset });
    }
    let (generation, documents) = read_active(db, P::NAME).await?;
    Ok(Snapshot { projection: P::NAME.to_owned(), generation, topic: topic.to_owned(), created_at_ms: now_ms(), positions, documents })
}

/// The active generation and its rows, in one snapshot of the database.
async fn read_active(db: &Db, projection: &str) -> Result<(i64, Vec<DocumentRow>), StoreError> {
    let mut tx = db.begin().await?;
    if db.backend() == Backend::Postgres {
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY").execute(&mut *tx).await?;
    }
    let generation: i64 = sqlx::query("SELECT generation FROM active_generations WHERE projection = $1")
        .bind(projection)
        .fetch_one(&mut *tx)
        .await?
        .try_get("generation")?;
    let rows = sqlx::query(
        "SELECT job_id, caller, format, query, result_id, size_bytes, completed_at_ms, version, deleted_at_ms \
         FROM search_documents WHERE generation = $1 ORDER BY job_id",
    )
    .bind(generation)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let documents = rows
        .iter()
        .map(|r| {
            Ok(DocumentRow {
                job_id: r.try_get("job_id")?,
                caller: r.try_get("caller")?,
                format: r.try_get("format")?,
                query: r.try_get("query")?,
                result_id: r.try_get("result_id")?,
                size_bytes: r.try_get("size_bytes")?,
                completed_at_ms: r.try_get("completed_at_ms")?,
                version: r.try_get("version")?,
                deleted_at_ms: r.try_get("deleted_at_ms")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
    Ok((generation, documents))
}

/// Where a rebuild from `snapshot` starts on each partition (`boundary`
/// holds the low and high watermarks): the snapshot's position, which must
/// still be retained and not be ahead of the broker.
pub fn starts(
    snapshot: &Snapshot,
    projection: &str,
    topic: &str,
    boundary: &[generations::Position],
) -> Result<Vec<generations::Position>, RebuildError> {
    let bad = |m: String| RebuildError::Snapshot(m);
    if snapshot.projection != projection || snapshot.topic != topic {
        return Err(bad(format!("snapshot is of {} on {}, not {projection} on {topic}", snapshot.projection, snapshot.topic)));
    }
    boundary
        .iter()
        .map(|b| {
            let Some(at) = snapshot.position(b.partition) else {
                return Err(bad(format!("snapshot has no position for {topic} partition {}", b.partition)));
            };
            if at < b.next_offset {
                return Err(bad(format!(
                    "snapshot does not cover the gap: {topic} partition {} starts at offset {at} in the snapshot, earliest retained is {}",
                    b.partition, b.next_offset
                )));
            }
            if at > b.boundary_offset {
                return Err(bad(format!(
                    "snapshot is ahead of the broker: {topic} partition {} at offset {at}, end is {}",
                    b.partition, b.boundary_offset
                )));
            }
            Ok(generations::Position { partition: b.partition, next_offset: at, boundary_offset: b.boundary_offset })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot() -> Snapshot {
        Snapshot {
            projection: "search".into(),
            generation: 1,
            topic: "t".into(),
            created_at_ms: 5,
            positions: vec![SnapshotPosition { partition: 0, next_offset: 10 }],
            documents: vec![],
        }
    }

    #[test]
    fn round_trips_and_refuses_an_altered_body() {
        let bytes = snapshot().encode().unwrap();
        assert_eq!(Snapshot::decode(&bytes).unwrap(), snapshot());
        let text = String::from_utf8(bytes).unwrap().replace("\"next_offset\":10", "\"next_offset\":11");
        let err = Snapshot::decode(text.as_bytes()).unwrap_err().to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
        assert!(Snapshot::decode(b"garbage").is_err());
    }

    #[test]
    fn must_cover_what_is_retained() {
        let at = |low, high| vec![generations::Position { partition: 0, next_offset: low, boundary_offset: high }];
        assert_eq!(starts(&snapshot(), "search", "t", &at(4, 20)).unwrap()[0].next_offset, 10);
        assert!(starts(&snapshot(), "search", "t", &at(12, 20)).unwrap_err().to_string().contains("does not cover"));
        assert!(starts(&snapshot(), "search", "t", &at(0, 8)).is_err());
        assert!(starts(&snapshot(), "search", "other", &at(0, 20)).is_err());
    }
}
