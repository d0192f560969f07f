//! Every migration from 0017 on says which phase it is (ARCHITECTURE.md,
//! "Upgrades"): `-- phase: expand|contract` on its first line, and the same
//! phase in the `schema_phases` row it inserts for its own version, which is
//! what a role of an older release reads to decide whether it may run. Both
//! dialects ship the same versions.

use std::path::Path;

/// The first migration written under the rule.
const FIRST_WITH_PHASE: u32 = 17;

fn migrations(dialect: &str) -> Vec<(u32, String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations").join(dialect);
    let mut out: Vec<(u32, String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "sql"))
        .map(|path| {
            let name = path.file_name().and_then(|n| n.to_str()).expect("a UTF-8 name").to_owned();
            let version = name.split('_').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name}: no version"));
            (version, name, std::fs::read_to_string(&path).expect("readable"))
        })
        .collect();
    out.sort();
    out
}

#[test]
fn every_migration_under_the_rule_declares_its_phase_in_the_file_and_in_schema_phases() {
    for dialect in ["postgres", "sqlite"] {
        let all = migrations(dialect);
        assert!(all.iter().any(|(v, ..)| *v >= FIRST_WITH_PHASE), "{dialect}: no migration under the rule");
        for (version, name, text) in all.iter().filter(|(v, ..)| *v >= FIRST_WITH_PHASE) {
            let first = text.lines().next().unwrap_or_default();
            let phase = first.strip_prefix("-- phase: ").unwrap_or_else(|| panic!("{dialect}/{name}: first line is not `-- phase: …`"));
            assert!(["expand", "contract"].contains(&phase), "{dialect}/{name}: phase `{phase}`");
            let row = format!("VALUES ({version}, '{phase}', ");
            assert!(
                text.contains("INSERT INTO schema_phases") && text.contains(&row),
                "{dialect}/{name}: no `schema_phases` row `{row}…` for its own version and phase"
            );
        }
    }
}

#[test]
fn both_dialects_ship_the_same_versions() {
    let versions = |dialect| migrations(dialect).into_iter().map(|(v, ..)| v).collect::<Vec<_>>();
    assert_eq!(versions("postgres"), versions("sqlite"));
}

/// The bar an older release reads is the highest `readers_from` of *any*
/// row (v0.10.0 reads it so; later releases read only contract rows). An
/// expand row above the bar of the contractions before it would make a
/// release that may still run refuse to start: after `herald migrate` to 19,
/// v0.10.0 exited 2 and an upgrade's rollback failed (fixed by 0020).
async fn expand_rows_keep_the_bar(postgres: bool) -> anyhow::Result<()> {
    use sqlx::Row;
    let test_db = if postgres { herald_testkit::postgres_db().await? } else { herald_testkit::sqlite_db()? };
    let db = herald_store::Db::connect_and_migrate(&test_db.url).await?;
    let rows = sqlx::query("SELECT version, phase, readers_from FROM schema_phases ORDER BY version").fetch_all(db.pool()).await?;
    let mut bar = i64::from(FIRST_WITH_PHASE) - 1;
    for row in &rows {
        let (version, phase, readers_from): (i64, String, i64) = (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        if phase == "contract" {
            bar = bar.max(readers_from);
        } else {
            assert!(readers_from <= bar, "schema {version} ({phase}) raises the bar older releases read to {readers_from} (bar {bar})");
        }
    }
    let highest: i64 = sqlx::query("SELECT MAX(readers_from) AS r FROM schema_phases").fetch_one(db.pool()).await?.try_get("r")?;
    assert_eq!(highest, bar, "what an older release reads as the bar");
    Ok(())
}

#[tokio::test]
async fn expand_rows_keep_the_bar_older_releases_read_postgres() -> anyhow::Result<()> {
    expand_rows_keep_the_bar(true).await
}

#[tokio::test]
async fn expand_rows_keep_the_bar_older_releases_read_sqlite() -> anyhow::Result<()> {
    expand_rows_keep_the_bar(false).await
}
