//! The floor under any replay into search on this PostgreSQL server: what
//! the server spends to make a million documents searchable the cheapest way
//! it can, with nothing of a replay's own work. The documents (those the
//! benchmark publishes, under another run tag) go in one `COPY … FROM STDIN`
//! into a table shaped like a loading generation (`search_documents`'
//! columns and `arrival`, no index), then the indexes a sealed generation
//! has are built once over them, as the seal builds them
//! (`search::build_indexes`, the GIN beside the btrees and the key). The table is the
//! run's own and dropped afterwards.
//!
//! Added to what receiving the records costs (the raw consume, same run),
//! this bounds any replay here: with every core busy on nothing but those
//! two, at most `cores ÷ (receive + write)` events a second. The COPY's CPU
//! and the builds' wall time are kept apart too: a generation's indexes can
//! only be built once its last document is in, so a replay also takes at
//! least the load's CPU spread over every core, then the builds' length.

use std::time::Instant;

use anyhow::Context;
use herald_projections::search::{self, DocumentRef, Fact};
use herald_store::Db;

use super::cpu::{CpuMark, CpuUse};
use super::workload;

/// The floor's table: not a generation's, never attached.
const TABLE: &str = "bench_write_floor";
/// Bytes per message of the COPY stream.
const SEND: usize = 1 << 20;

/// What writing the floor took: wall seconds and the machine's CPU.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriteFloor {
    pub(crate) secs: f64,
    /// Of `secs`, building the indexes (the rest is the COPY).
    pub(crate) index_secs: f64,
    pub(crate) cpu: Option<CpuUse>,
    /// Of `cpu`, the COPY's: what loading the documents cost the machine.
    pub(crate) copy_cpu: Option<CpuUse>,
}

/// Writes `n` documents of run `tag` as described above.
pub(crate) async fn write_floor(db: &Db, tag: &str, n: usize) -> anyhow::Result<WriteFloor> {
    let pool = db.native_postgres(2)?.context("the write floor needs PostgreSQL")?;
    sqlx::query(&format!("DROP TABLE IF EXISTS {TABLE}")).execute(&pool).await?;
    sqlx::query(&format!("CREATE TABLE {TABLE} (LIKE search_documents, arrival BIGINT) WITH (autovacuum_enabled = false)"))
        .execute(&pool)
        .await?;
    // Formatted before the clock starts: the floor is the server's work.
    let text = copy_text(tag, n);
    let (started, mark) = (Instant::now(), CpuMark::now());
    let mut conn = pool.acquire().await?;
    let mut copy = conn.copy_in_raw(&format!("COPY {TABLE} ({}) FROM STDIN", search::COPY_COLUMNS)).await?;
    for chunk in text.chunks(SEND) {
        copy.send(chunk).await?;
    }
    let rows = copy.finish().await?;
    let copy_cpu = mark.and_then(|m| m.used());
    drop(conn);
    anyhow::ensure!(rows == n as u64, "the write floor copied {rows} documents, expected {n}");
    let indexing = Instant::now();
    search::build_indexes(db, TABLE).await?;
    let floor = WriteFloor {
        secs: started.elapsed().as_secs_f64(),
        index_secs: indexing.elapsed().as_secs_f64(),
        cpu: mark.and_then(|m| m.used()),
        copy_cpu,
    };
    sqlx::query(&format!("DROP TABLE {TABLE}")).execute(&pool).await?;
    pool.close().await;
    Ok(floor)
}

/// COPY's text format of `n` documents of run `tag`, one generation, as a
/// replay sends them (`search::copy_line`), arriving in order.
fn copy_text(tag: &str, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 128);
    for i in 0..n {
        let fact = Fact::Completed(workload::completion(tag, i));
        search::copy_line(&mut out, 999, DocumentRef::from(&fact), i as i64);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_document_is_one_line_of_the_replay_columns() {
        let text = String::from_utf8(copy_text("t", 3)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        for line in lines {
            let columns: Vec<&str> = line.split('\t').collect();
            assert_eq!(columns.len(), search::COPY_COLUMNS.split(',').count(), "{line}");
            assert_eq!((columns[0], columns[9]), ("999", "\\N"));
            assert!(columns[10].parse::<i64>().is_ok(), "{line}");
        }
    }
}
