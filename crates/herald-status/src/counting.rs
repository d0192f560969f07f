//! Counts that stay cheap however big a table grows: each is a range of an
//! index, read exactly up to [`EXACT_UP_TO`] rows. Above that a figure is
//! informational (a million settled intents, three million inbox rows), so
//! PostgreSQL answers with its planner's estimate and the figure is marked
//! as one; SQLite, which keeps no such estimate, keeps counting.
//!
//! Filters are SQL over constants of this crate or values quoted by
//! [`literal`], so every count is one plain statement the planner sees in
//! full (an estimate needs the values, not placeholders).

use herald_store::{Backend, Db, StoreError, Tx};
use sqlx::Row;

/// One refresh's reads: one transaction, so the figures share a snapshot
/// and agree with each other. On PostgreSQL it runs without parallel
/// workers and JIT: every read is a short index range, and starting workers
/// (about 10 ms) or compiling (a quarter of a second when the planner
/// misjudges a range) costs more than the read.
pub struct Reading {
    tx: Tx<'static>,
    backend: Backend,
    now_sql: &'static str,
}

impl Reading {
    pub async fn begin(db: &Db) -> Result<Reading, StoreError> {
        let mut tx = db.begin().await?;
        if db.backend() == Backend::Postgres {
            sqlx::query("SET LOCAL max_parallel_workers_per_gather = 0").execute(&mut *tx).await?;
            sqlx::query("SET LOCAL jit = off").execute(&mut *tx).await?;
        }
        Ok(Reading { tx, backend: db.backend(), now_sql: db.now_sql() })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The database's clock in SQL (see [`Db::now_sql`]).
    pub fn now_sql(&self) -> &'static str {
        self.now_sql
    }

    pub fn conn(&mut self) -> &mut sqlx::AnyConnection {
        &mut self.tx
    }

    /// Ends the transaction (it wrote nothing).
    pub async fn finish(self) -> Result<(), StoreError> {
        Ok(self.tx.commit().await?)
    }
}

/// Rows counted exactly before a count on PostgreSQL becomes an estimate.
/// Everything an operator acts on (a backlog of dead letters, intents in
/// `unknown`, open jobs) is far below this in a healthy system.
pub const EXACT_UP_TO: i64 = 10_000;

/// A count, and whether it is the planner's estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Count {
    pub n: i64,
    pub estimated: bool,
}

/// `value` as an SQL string literal.
pub fn literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// Rows of `table` matching `filter`: exact up to `cap`, above it an
/// estimate on PostgreSQL (never below the rows already counted).
pub async fn count(reading: &mut Reading, table: &str, filter: &str, cap: i64) -> Result<Count, StoreError> {
    // Where the planner already knows the range is many times the cap, the
    // capped count would only confirm it: its estimate is the figure.
    if reading.backend() == Backend::Postgres {
        let planned = estimate(reading, table, filter).await?;
        if planned.is_some_and(|p| p >= cap.saturating_mul(SURELY_ABOVE)) {
            return Ok(Count { n: planned.unwrap_or_default(), estimated: true });
        }
    }
    let capped = format!("SELECT COUNT(*) AS n FROM (SELECT 1 FROM {table} WHERE {filter} LIMIT {}) AS capped", cap + 1);
    let n: i64 = sqlx::query(&capped).fetch_one(reading.conn()).await?.try_get("n")?;
    if n <= cap {
        return Ok(Count { n, estimated: false });
    }
    if reading.backend() == Backend::Sqlite {
        let all = format!("SELECT COUNT(*) AS n FROM {table} WHERE {filter}");
        return Ok(Count { n: sqlx::query(&all).fetch_one(reading.conn()).await?.try_get("n")?, estimated: false });
    }
    Ok(Count { n: estimate(reading, table, filter).await?.unwrap_or(n).max(n), estimated: true })
}

/// How many times the cap the planner must expect before its estimate is
/// taken without counting (a stale estimate off by that much is rare, and
/// the figure says it is an estimate either way).
const SURELY_ABOVE: i64 = 10;

/// PostgreSQL's planner estimate of the rows matching `filter`.
async fn estimate(reading: &mut Reading, table: &str, filter: &str) -> Result<Option<i64>, StoreError> {
    let plan = sqlx::query(&format!("EXPLAIN SELECT 1 FROM {table} WHERE {filter}")).fetch_all(reading.conn()).await?;
    let top: Option<String> = plan.first().map(|r| r.try_get(0)).transpose()?;
    Ok(top.as_deref().and_then(planned_rows))
}

/// The row estimate of a plan's top line (`… (cost=… rows=N width=…)`).
fn planned_rows(line: &str) -> Option<i64> {
    let after = line.split_once("rows=")?.1;
    after.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// The distinct values of `column` in `table`, read as a loose index scan
/// (one index probe per value), so a status column of a million rows with
/// six statuses costs six probes. Needs an index leading with `column`.
pub async fn distinct(reading: &mut Reading, table: &str, column: &str) -> Result<Vec<String>, StoreError> {
    let sql = format!(
        "WITH RECURSIVE v(x) AS (SELECT MIN({column}) FROM {table} \
         UNION ALL SELECT (SELECT MIN({column}) FROM {table} WHERE {column} > v.x) FROM v WHERE v.x IS NOT NULL) \
         SELECT x FROM v WHERE x IS NOT NULL"
    );
    sqlx::query(&sql).fetch_all(reading.conn()).await?.iter().map(|r| Ok(r.try_get("x")?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_estimate_of_a_plan_line() {
        assert_eq!(planned_rows("Index Only Scan using x on t  (cost=0.43..31.2 rows=998765 width=0)"), Some(998_765));
        assert_eq!(planned_rows("Seq Scan on t  (cost=0.00..1.01 rows=1 width=4)"), Some(1));
        assert_eq!(planned_rows("Result"), None);
    }

    #[test]
    fn quotes_a_literal() {
        assert_eq!(literal("it's"), "'it''s'");
    }
}
