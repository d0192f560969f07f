//! The rebuild handed from the old release to the new: the old binary's
//! `herald rebuild search` opens the next generation and replays until it
//! meets the record of a job in the middle of the history, where the drill
//! stops it; the new binary's rebuild then resumes the generation and
//! switches reads to it.
//!
//! "Half way" is certain rather than likely: the replay cannot pass that
//! job's record. On PostgreSQL the drill holds an uncommitted copy of the
//! job's document in the new generation, sees the replay wait for it in
//! `pg_stat_activity` and SIGKILLs the process there. On SQLite, whose one
//! writer would stall every role behind such a hold, a trigger refuses the
//! job's document and the replay fails on it; the trigger is dropped after.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use herald_store::{Backend, Db};
use sqlx::Row;
use tokio::process::Command;

use super::{RebuildHandover, Release, WITHIN, scalar};
use crate::drill::procs::Procs;

/// Starts the old release's rebuild, holds it half way, kills it.
pub async fn interrupt_rebuild(release: &Release, db: &Db, procs: &Procs) -> anyhow::Result<RebuildHandover> {
    let active: i64 = scalar(db, "SELECT generation AS n FROM active_generations WHERE projection = 'search'").await?;
    let next: i64 =
        scalar(db, "SELECT COALESCE(MAX(generation), 0) + 1 AS n FROM projection_generations WHERE projection = 'search'").await?;
    let documents: i64 = scalar(db, &format!("SELECT COUNT(*) AS n FROM search_documents WHERE generation = {active}")).await?;
    anyhow::ensure!(documents >= 2, "only {documents} search documents: too little history to stop a rebuild half way");
    // A job in the middle of the history: the batches before it commit.
    let middle = format!(
        "SELECT job_id FROM search_documents WHERE generation = {active} ORDER BY completed_at_ms, job_id LIMIT 1 OFFSET {}",
        documents / 2
    );
    let job: String = sqlx::query(&middle).fetch_one(db.pool()).await?.try_get("job_id")?;
    let old = procs.one_off(&release.old, "rebuild-old", &["rebuild", "search", "--batch", "10", "--json"])?;
    match db.backend() {
        Backend::Postgres => held_then_killed(db, old, active, next, &job).await?,
        Backend::Sqlite => refused_by_trigger(db, old, next, &job).await?,
    }
    let state = sqlx::query("SELECT state FROM projection_generations WHERE projection = 'search' AND generation = $1")
        .bind(next)
        .fetch_optional(db.pool())
        .await?
        .map(|row| row.try_get::<String, _>("state"))
        .transpose()?
        .unwrap_or_else(|| "absent".to_owned());
    tracing::info!(generation = next, state, job, "upgrade: the old release's rebuild killed half way");
    Ok(RebuildHandover { generation: next, interrupted_state: state, ..RebuildHandover::default() })
}

/// PostgreSQL: the job's document held uncommitted in generation `next`;
/// the replay waits for it and is SIGKILLed waiting.
async fn held_then_killed(db: &Db, mut old: Command, active: i64, next: i64, job: &str) -> anyhow::Result<()> {
    let mut gate = db.pool().begin().await?;
    sqlx::query(&copy_into_generation(db, next).await?).bind(active).bind(job).execute(&mut *gate).await?;
    let mut old = old.spawn()?;
    let deadline = Instant::now() + WITHIN;
    loop {
        if let Some(status) = old.try_wait()? {
            anyhow::bail!("the old release's rebuild ended ({status}) before it reached the held document");
        }
        if replay_waits_on_the_gate(db).await? {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the old release's rebuild did not reach the held document within {WITHIN:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    old.start_kill()?;
    old.wait().await?;
    gate.rollback().await?;
    Ok(())
}

/// SQLite: a trigger refuses the job's document in generation `next`; the
/// replay's batch fails there and the process ends.
async fn refused_by_trigger(db: &Db, mut old: Command, next: i64, job: &str) -> anyhow::Result<()> {
    let job = job.replace('\'', "''");
    let create = format!(
        "CREATE TRIGGER herald_drill_gate BEFORE INSERT ON search_documents \
         WHEN NEW.generation = {next} AND NEW.job_id = '{job}' \
         BEGIN SELECT RAISE(ABORT, 'herald drill: the upgrade stops this rebuild here'); END"
    );
    sqlx::query(&create).execute(db.pool()).await?;
    let ended = tokio::time::timeout(WITHIN, old.status()).await;
    sqlx::query("DROP TRIGGER herald_drill_gate").execute(db.pool()).await?;
    let status = ended.with_context(|| format!("the old release's rebuild did not reach the refused document within {WITHIN:?}"))??;
    anyhow::ensure!(!status.success(), "the old release's rebuild finished although the drill refused one of its documents");
    Ok(())
}

/// The new binary resumes the generation the old one left.
pub async fn resume_rebuild(release: &Release, db: &Db, procs: &Procs, handover: &mut RebuildHandover) -> anyhow::Result<()> {
    let mut command = procs.one_off(&release.new, "rebuild-new", &["rebuild", "search", "--json"])?;
    let out = tokio::time::timeout(Duration::from_secs(180), command.stdout(Stdio::piped()).output())
        .await
        .context("the new release's rebuild did not finish within 180 s")??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    handover.resume_exit = out.status.code();
    handover.resume_report = stdout
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str::<serde_json::Value>(line).ok()?.get("report").cloned())
        .unwrap_or_default();
    handover.active_after = Some(scalar(db, "SELECT generation AS n FROM active_generations WHERE projection = 'search'").await?);
    Ok(())
}

/// `INSERT` of the active generation's row of a job (`$1`, `$2`) into
/// generation `next`, whatever columns the release's schema has.
async fn copy_into_generation(db: &Db, next: i64) -> anyhow::Result<String> {
    let columns: Vec<String> = sqlx::query(
        "SELECT column_name::text AS c FROM information_schema.columns \
         WHERE table_name = 'search_documents' AND table_schema = current_schema() ORDER BY ordinal_position",
    )
    .fetch_all(db.pool())
    .await?
    .iter()
    .map(|row| row.try_get("c"))
    .collect::<Result<_, _>>()?;
    let values: Vec<String> = columns.iter().map(|c| if c == "generation" { next.to_string() } else { c.clone() }).collect();
    Ok(format!(
        "INSERT INTO search_documents ({}) SELECT {} FROM search_documents WHERE generation = $1 AND job_id = $2",
        columns.join(", "),
        values.join(", ")
    ))
}

/// Some session writing search documents waits for a lock: the replay met
/// the held row (live subscriptions are frozen or write other jobs).
async fn replay_waits_on_the_gate(db: &Db) -> anyhow::Result<bool> {
    let sql = "SELECT COUNT(*) AS n FROM pg_stat_activity \
               WHERE datname = current_database() AND wait_event_type = 'Lock' AND query ILIKE '%search_documents%'";
    Ok(scalar(db, sql).await? > 0)
}
