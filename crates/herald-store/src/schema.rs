//! Which database schema this binary runs on, checked by every role at
//! start: only `herald migrate` changes the schema, so a role of one release
//! must refuse a schema it does not know rather than read columns that are
//! not there (or are no longer there).
//!
//! A schema newer than the binary is fine while every migration the binary
//! does not know only *expanded* it (added what the new release reads); a
//! *contract* migration (one that removes or renames what an older release
//! reads) records `readers_from`, the oldest schema version whose binaries
//! still run on it (`schema_phases`). ARCHITECTURE.md, "Upgrades", has the rule.

use sqlx::Row;

use crate::{Backend, Db, StoreError};

/// What the database says about its schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The newest migration applied; `None`: no Herald schema at all.
    pub applied: Option<i64>,
    /// The oldest schema version whose binaries may run on it; `None`:
    /// no contract migration said otherwise.
    pub readers_from: Option<i64>,
    /// A migration that failed half way (sqlx recorded it unsuccessful).
    pub failed: Option<i64>,
}

/// Whether a binary that knows migrations up to `knows` may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The schema is the one this binary ships.
    Current,
    /// A later release migrated, expanding only: this binary runs.
    NewerCompatible { found: i64 },
    /// Migrations of this binary are not applied: `herald migrate` first.
    Behind { found: Option<i64>, needs: i64 },
    /// A later release contracted what this binary reads: a newer binary.
    TooNew { found: i64, readers_from: i64, knows: i64 },
    /// A migration stopped half way: an operator repairs it first.
    Failed { version: i64 },
}

/// The rule, free of IO.
pub fn judge(found: Found, knows: i64) -> Verdict {
    if let Some(version) = found.failed {
        return Verdict::Failed { version };
    }
    match found.applied {
        Some(applied) if applied == knows => Verdict::Current,
        Some(applied) if applied > knows => match found.readers_from {
            Some(from) if from > knows => Verdict::TooNew { found: applied, readers_from: from, knows },
            _ => Verdict::NewerCompatible { found: applied },
        },
        other => Verdict::Behind { found: other, needs: knows },
    }
}

impl Verdict {
    /// May a role start?
    pub fn runs(self) -> bool {
        matches!(self, Verdict::Current | Verdict::NewerCompatible { .. })
    }

    /// What an operator reads when a role refuses to start.
    pub fn refusal(self) -> Option<String> {
        match self {
            Verdict::Current | Verdict::NewerCompatible { .. } => None,
            Verdict::Behind { found: None, needs } => Some(format!(
                "the database has no Herald schema; this herald needs schema version {needs}: \
                 run `herald migrate` (`--dry-run` lists what it applies)"
            )),
            Verdict::Behind { found: Some(found), needs } => Some(format!(
                "the database schema is at version {found}; this herald needs version {needs}: \
                 run `herald migrate` with this release first (`--dry-run` lists what it applies)"
            )),
            Verdict::Failed { version } => Some(format!(
                "migration {version} failed half way (recorded unsuccessful in _sqlx_migrations): finish or undo it by hand, \
                 delete its row, then run `herald migrate`"
            )),
            Verdict::TooNew { found, readers_from, knows } => Some(format!(
                "the database schema is at version {found}, which only releases knowing schema version \
                 {readers_from} or later can run on (a later release removed what this one reads); \
                 this herald knows up to version {knows}: run a newer release"
            )),
        }
    }
}

/// The newest migration this binary ships for `backend`.
pub fn newest_known(db: &Db) -> i64 {
    db.migrator().iter().map(|m| m.version).max().unwrap_or(0)
}

/// Reads what the database says; a database never migrated has no tables.
pub async fn found(db: &Db) -> Result<Found, StoreError> {
    if !table_exists(db, "_sqlx_migrations").await? {
        return Ok(Found { applied: None, readers_from: None, failed: None });
    }
    let applied: Option<i64> =
        sqlx::query("SELECT MAX(version) AS v FROM _sqlx_migrations WHERE success").fetch_one(db.pool()).await?.try_get("v")?;
    let failed: Option<i64> =
        sqlx::query("SELECT MIN(version) AS v FROM _sqlx_migrations WHERE NOT success").fetch_one(db.pool()).await?.try_get("v")?;
    // Only a contract migration excludes older releases; an expand row's
    // `readers_from` documents, it does not exclude.
    let readers_from = if table_exists(db, "schema_phases").await? {
        sqlx::query("SELECT MAX(readers_from) AS r FROM schema_phases WHERE phase = 'contract'").fetch_one(db.pool()).await?.try_get("r")?
    } else {
        None
    };
    Ok(Found { applied, readers_from, failed })
}

/// The check every role makes at start: `Err(StoreError::Config)` with the
/// refusal (the binaries exit 2 on it).
pub async fn check(db: &Db) -> Result<Verdict, StoreError> {
    let verdict = judge(found(db).await?, newest_known(db));
    match verdict.refusal() {
        Some(refusal) => Err(StoreError::Config(refusal)),
        None => Ok(verdict),
    }
}

/// The migrations `herald migrate` would apply: (version, description).
pub async fn pending(db: &Db) -> Result<Vec<(i64, String)>, StoreError> {
    let mut pending = Vec::new();
    if table_exists(db, "_sqlx_migrations").await? {
        let done: Vec<i64> = sqlx::query("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(db.pool())
            .await?
            .iter()
            .map(|row| row.try_get("version"))
            .collect::<Result<_, _>>()?;
        pending.extend(db.migrator().iter().filter(|m| !done.contains(&m.version)).map(|m| (m.version, m.description.to_string())));
    } else {
        pending.extend(db.migrator().iter().map(|m| (m.version, m.description.to_string())));
    }
    Ok(pending)
}

async fn table_exists(db: &Db, name: &str) -> Result<bool, StoreError> {
    let sql = match db.backend() {
        Backend::Postgres => "SELECT COUNT(*) AS n FROM pg_catalog.pg_tables WHERE schemaname = current_schema() AND tablename = $1",
        Backend::Sqlite => "SELECT COUNT(*) AS n FROM sqlite_master WHERE type = 'table' AND name = $1",
    };
    let n: i64 = sqlx::query(sql).bind(name).fetch_one(db.pool()).await?.try_get("n")?;
    Ok(n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(applied: Option<i64>, readers_from: Option<i64>) -> Found {
        Found { applied, readers_from, failed: None }
    }

    #[test]
    fn a_migration_that_failed_half_way_stops_every_role() {
        let verdict = judge(Found { applied: Some(16), readers_from: None, failed: Some(17) }, 17);
        assert_eq!(verdict, Verdict::Failed { version: 17 });
        assert!(verdict.refusal().is_some_and(|r| r.contains("17") && r.contains("half way")));
    }

    #[test]
    fn the_binarys_own_schema_runs() {
        assert_eq!(judge(found(Some(17), Some(16)), 17), Verdict::Current);
    }

    #[test]
    fn an_older_schema_or_none_needs_a_migrate() {
        assert_eq!(judge(found(None, None), 17), Verdict::Behind { found: None, needs: 17 });
        assert_eq!(judge(found(Some(16), None), 17), Verdict::Behind { found: Some(16), needs: 17 });
        assert!(judge(found(Some(16), None), 17).refusal().is_some_and(|r| r.contains("herald migrate") && r.contains("16")));
    }

    #[test]
    fn a_newer_schema_runs_until_a_contract_migration_excludes_this_release() {
        assert_eq!(judge(found(Some(19), Some(16)), 17), Verdict::NewerCompatible { found: 19 });
        assert_eq!(judge(found(Some(19), Some(17)), 17), Verdict::NewerCompatible { found: 19 });
        let too_new = judge(found(Some(19), Some(18)), 17);
        assert_eq!(too_new, Verdict::TooNew { found: 19, readers_from: 18, knows: 17 });
        assert!(!too_new.runs());
        assert!(too_new.refusal().is_some_and(|r| r.contains("19") && r.contains("18") && r.contains("newer release")));
    }
}
