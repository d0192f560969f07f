//! `herald drill --upgrade-from OLD`: a rolling upgrade with work in flight.
//! Every role starts on an older release's binary. Under load, the old
//! release leaves a search rebuild half done (its replay held on a row the
//! drill writes, then the process SIGKILLed), the subscriptions and
//! dispatchers are frozen (SIGSTOP) with records behind them and a provider
//! call under a claim, the relays too with outbox rows behind them; then
//! this binary's `herald migrate` runs beside the old roles, and the roles
//! are replaced one at a time (SIGTERM, start this binary). The last step is
//! rolled back (the new process stopped, the old one started on the
//! migrated schema) and this binary resumes the old release's rebuild. The
//! drill's drain and audit then judge the result as after any drill.

mod rebuild;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use herald_store::Db;
use serde::Serialize;
use sqlx::Row;

use super::brokers::Brokers;
use super::drain;
use super::procs::Procs;
use rebuild::{interrupt_rebuild, resume_rebuild};

/// How long a stopped role may take to drain before it is killed.
const GRACE: Duration = Duration::from_secs(15);
/// How long the drill waits for a state it needs (a backlog, a held call).
const WITHIN: Duration = Duration::from_secs(90);

/// The two binaries of the upgrade.
pub struct Release {
    pub old: PathBuf,
    pub new: PathBuf,
}

/// What the upgrade did, for the report.
#[derive(Debug, Serialize)]
pub struct UpgradeReport {
    pub from: String,
    pub to: String,
    pub schema_before: i64,
    pub schema_after: i64,
    /// `herald migrate`'s exit code (the new binary, old roles running).
    pub migrate_exit: Option<i32>,
    /// Work in flight when the new binary migrated.
    pub in_flight: InFlight,
    pub steps: Vec<Step>,
    /// The process whose step was rolled back (it ends on the old binary).
    pub rolled_back: String,
    /// Processes that exited on their own after their step and were
    /// restarted: a binary that refuses the schema, or crashes on it.
    pub restarted_after_step: Vec<String>,
    pub rebuild: RebuildHandover,
}

impl UpgradeReport {
    /// The upgrade itself went as planned (the audit judges the data).
    pub fn ok(&self) -> bool {
        self.migrate_exit == Some(0)
            && self.restarted_after_step.is_empty()
            && self.schema_after > self.schema_before
            && self.rebuild.interrupted_state == "building"
            && self.rebuild.resume_exit == Some(0)
            && self.rebuild.active_after == Some(self.rebuild.generation)
    }
}

/// Backlog and held work at one moment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct InFlight {
    /// Outbox rows not yet delivered.
    pub pending_outbox: i64,
    /// Completions on the topic some subscription has not applied.
    pub unconsumed: i64,
    /// Intents whose provider call started under a claim and has no outcome.
    pub calls_under_claim: i64,
    /// Search generations being built.
    pub rebuilds_building: i64,
}

/// One role replaced.
#[derive(Debug, Serialize)]
pub struct Step {
    pub process: String,
    /// `new` or, for the rollback, `old`.
    pub to: &'static str,
    /// How the stopped process exited (`None`: killed after the grace).
    pub stopped_exit: Option<i32>,
    #[serde(skip)]
    index: usize,
    /// Starts of the process once this step started it.
    #[serde(skip)]
    starts: u32,
    pub in_flight: InFlight,
}

/// The old release's rebuild, interrupted, and the new one's resume.
#[derive(Debug, Default, Serialize)]
pub struct RebuildHandover {
    pub generation: i64,
    /// The generation's state after the old process was killed.
    pub interrupted_state: String,
    pub resume_exit: Option<i32>,
    /// The resuming rebuild's report (`--json`'s `report` line).
    pub resume_report: serde_json::Value,
    pub active_after: Option<i64>,
}

/// Runs the upgrade in about `within`: traffic flows between the steps.
pub async fn run(release: &Release, db: &Db, procs: &mut Procs, brokers: &mut Brokers, within: Duration) -> anyhow::Result<UpgradeReport> {
    let gap = within / u32::try_from(procs.all().len() + 3).unwrap_or(u32::MAX);
    let schema_before = schema_version(db).await?;
    warm_up(db, procs, brokers).await?;
    let mut rebuild = interrupt_rebuild(release, db, procs).await?;
    freeze_with_work_held(db, procs).await?;
    let in_flight = in_flight(db).await?;
    let migrate = procs.one_off(&release.new, "migrate", &["migrate"])?.status().await?;
    let schema_after = schema_version(db).await?;
    let mut steps = Vec::new();
    // The relays last: the rollback then runs an old relay beside a new one
    // on the migrated schema, the pair whose progress records differ most.
    let mut order: Vec<usize> = procs.all().filter(|i| procs.role(*i) != "provider-sim").collect();
    order.sort_by_key(|i| procs.role(*i) == "relay");
    for i in order {
        steps.push(step(db, procs, i, &release.new, "new").await?);
        pace(procs, brokers, gap).await?;
    }
    let last = steps.last().map(|s| s.process.clone()).context("no role to upgrade")?;
    let last_index = procs.all().find(|i| procs.name(*i) == last).context("the last step's process")?;
    steps.push(step(db, procs, last_index, &release.old, "old").await?);
    pace(procs, brokers, gap).await?;
    resume_rebuild(release, db, procs, &mut rebuild).await?;
    // A process's last step started it; any start since is a restart.
    let last_starts: std::collections::BTreeMap<usize, (u32, &str)> =
        steps.iter().map(|s| (s.index, (s.starts, s.process.as_str()))).collect();
    let restarted_after_step: Vec<String> =
        last_starts.iter().filter(|(i, (starts, _))| procs.starts(**i) > *starts).map(|(_, (_, name))| (*name).to_owned()).collect();
    Ok(UpgradeReport {
        from: version(&release.old).await?,
        to: version(&release.new).await?,
        schema_before,
        schema_after,
        migrate_exit: migrate.code(),
        in_flight,
        steps,
        rolled_back: last,
        restarted_after_step,
        rebuild,
    })
}

async fn step(db: &Db, procs: &mut Procs, i: usize, exe: &Path, to: &'static str) -> anyhow::Result<Step> {
    let in_flight = in_flight(db).await?;
    let process = procs.name(i).to_owned();
    tracing::info!(process, to, ?in_flight, "upgrade: replacing");
    let stopped_exit = procs.replace(i, exe, GRACE).await?;
    Ok(Step { process, to, stopped_exit, index: i, starts: procs.starts(i), in_flight })
}

/// Search documents the old release must have applied before its rebuild:
/// the rebuild stops at the middle one, after batches of the others.
const HISTORY: i64 = 20;

/// Waits (processes and brokers ticking) until the old release's pipeline
/// has carried enough exports through to search.
async fn warm_up(db: &Db, procs: &mut Procs, brokers: &mut Brokers) -> anyhow::Result<()> {
    let sql = "SELECT COUNT(*) AS n FROM search_documents \
               WHERE generation = (SELECT generation FROM active_generations WHERE projection = 'search')";
    let deadline = Instant::now() + WITHIN;
    loop {
        let documents = scalar(db, sql).await?;
        if documents >= HISTORY {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "only {documents} search documents after {WITHIN:?} on the old release");
        pace(procs, brokers, Duration::from_millis(200)).await?;
    }
}

/// Keeps processes and brokers ticking for `gap`.
async fn pace(procs: &mut Procs, brokers: &mut Brokers, gap: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + gap;
    while Instant::now() < until {
        procs.tick()?;
        brokers.tick()?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Freezes the dispatchers (at a moment a provider call is under a claim)
/// and the subscriptions, waits until completions wait behind them, then
/// freezes the relays and waits until outbox rows wait behind those.
async fn freeze_with_work_held(db: &Db, procs: &mut Procs) -> anyhow::Result<()> {
    let of_role = |procs: &Procs, prefix: &str| procs.all().filter(|i| procs.role(*i).starts_with(prefix)).collect::<Vec<_>>();
    // Dispatchers first, while intents keep coming: still held once they
    // are frozen, the call cannot finish now.
    let dispatchers = of_role(procs, "dispatch");
    freeze(db, procs, &dispatchers, "a provider call under a claim", |f| f.calls_under_claim > 0).await?;
    let subscriptions = of_role(procs, "consume-");
    freeze(db, procs, &subscriptions, "the subscriptions", |_| true).await?;
    wait_for(db, "completions behind the subscriptions", |f| f.unconsumed > 0).await?;
    let relays = of_role(procs, "relay");
    freeze(db, procs, &relays, "the relays", |_| true).await?;
    wait_for(db, "outbox rows behind the relays", |f| f.pending_outbox > 0).await
}

/// SIGSTOPs `group` at a moment `held` is true once they are frozen and none
/// of them holds SQLite's write lock (a frozen writer would stall every
/// role); thaws and tries again otherwise.
async fn freeze(db: &Db, procs: &Procs, group: &[usize], what: &str, held: impl Fn(&InFlight) -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + WITHIN;
    let (mut tries, mut lock_busy) = (0, 0);
    loop {
        if held(&in_flight(db).await?) {
            tries += 1;
            for i in group {
                procs.signal(*i, "-STOP").await?;
            }
            if held(&in_flight(db).await?) {
                if write_lock_free(db).await? {
                    return Ok(());
                }
                lock_busy += 1;
            }
            for i in group {
                procs.signal(*i, "-CONT").await?;
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "could not freeze {what} within {WITHIN:?}: {tries} tries, {lock_busy} with SQLite's write lock held"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether a write transaction can begin (always on PostgreSQL, where a
/// frozen process holds only its own rows). A running process holds
/// SQLite's lock for milliseconds; a frozen one would hold it for good, so
/// two seconds tell them apart.
async fn write_lock_free(db: &Db) -> anyhow::Result<bool> {
    if db.backend() != herald_store::Backend::Sqlite {
        return Ok(true);
    }
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect(db.url()).await?;
    sqlx::query("PRAGMA busy_timeout = 2000").execute(&mut conn).await?;
    let free = sqlx::query("BEGIN IMMEDIATE").execute(&mut conn).await.is_ok();
    if free {
        sqlx::query("ROLLBACK").execute(&mut conn).await?;
    }
    conn.close().await?;
    Ok(free)
}

async fn wait_for(db: &Db, what: &str, done: impl Fn(&InFlight) -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + WITHIN;
    while !done(&in_flight(db).await?) {
        anyhow::ensure!(Instant::now() < deadline, "no {what} within {WITHIN:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

async fn in_flight(db: &Db) -> anyhow::Result<InFlight> {
    let progress = drain::progress(db).await?;
    let applied = progress.applied.iter().copied().min().unwrap_or(0);
    let building =
        scalar(db, "SELECT COUNT(*) AS n FROM projection_generations WHERE projection = 'search' AND state = 'building'").await?;
    Ok(InFlight {
        pending_outbox: progress.unsent_outbox,
        unconsumed: (progress.completions - applied).max(0),
        calls_under_claim: calls_under_claim(db).await?,
        rebuilds_building: building,
    })
}

async fn calls_under_claim(db: &Db) -> anyhow::Result<i64> {
    let sql = "SELECT COUNT(*) AS n FROM notification_intents \
               WHERE status = 'pending' AND claim_owner IS NOT NULL AND call_started_at_ms IS NOT NULL";
    scalar(db, sql).await
}

async fn schema_version(db: &Db) -> anyhow::Result<i64> {
    Ok(herald_store::schema::found(db).await?.applied.unwrap_or(0))
}

/// The one number `sql` selects, named `n`.
pub(super) async fn scalar(db: &Db, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query(sql).fetch_one(db.pool()).await?.try_get("n")?)
}

async fn version(exe: &Path) -> anyhow::Result<String> {
    let out = tokio::process::Command::new(exe).arg("--version").output().await?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
