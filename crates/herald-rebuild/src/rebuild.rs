//! The rebuild procedure: plan, open generation N+1 with its boundary (or
//! resume it), replay to the boundary, verify, and switch reads — or stop
//! at `ready`.

use herald_consumer::Projection;
use herald_consumer::replay::{self, ReplayProgress};
use herald_envelope::Registry;
use herald_fault::{Hook, Point};
use herald_kafka::{KafkaConfig, offsets};
use herald_projections::search::DocumentRow;
use herald_store::Db;
use herald_store::delivered::Settled;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info};

use crate::generations::{self, BUILDING, Boundary, CATCHING_UP, FAILED, Generation, Position, READY};
use crate::snapshot::{self, Snapshot};
use crate::{RebuildError, history, verify};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchMode {
    /// Switch reads as soon as the new generation verified.
    Auto,
    /// Stop at `ready`; `herald rebuild switch` finishes.
    Manual,
}

#[derive(Debug, Clone)]
pub struct RebuildOptions {
    pub kafka: KafkaConfig,
    pub topic: String,
    pub switch: SwitchMode,
    /// Replay to the end of the topic and verify against the projection's
    /// source of truth: for a live subscription that is stopped or behind.
    pub offline: bool,
    /// Plan only: print the boundary and what would be replayed.
    pub dry_run: bool,
    /// Records per replay transaction.
    pub batch: usize,
    /// Start from this snapshot (`herald snapshot search`) instead of the
    /// earliest retained records.
    pub from_snapshot: Option<std::path::PathBuf>,
    /// Fault hook, none in production: called at `before-open`, after the
    /// topic's ends were read and before the generation opens.
    pub faults: Hook,
    /// Writer schemas and accepted sources of the replay, as the live
    /// subscription's (a record it would refuse is skipped).
    pub registry: Registry,
}

impl Default for RebuildOptions {
    fn default() -> Self {
        RebuildOptions {
            kafka: KafkaConfig::new(""),
            topic: String::new(),
            switch: SwitchMode::Auto,
            offline: false,
            dry_run: false,
            batch: replay::DEFAULT_BATCH,
            from_snapshot: None,
            faults: Hook::none(),
            registry: Registry::embedded(),
        }
    }
}

/// Receives what a rebuild is doing, for a progress bar or plain lines.
pub trait Progress: Send {
    fn phase(&mut self, message: &str);
    fn replayed(&mut self, progress: ReplayProgress);
}

#[derive(Debug, Clone, Serialize)]
pub struct RebuildReport {
    pub projection: String,
    pub generation: i64,
    pub previous_active: i64,
    pub state: String,
    pub replayed: u64,
    pub to_replay: u64,
    /// Rows reads can find in the new generation (documents, counters).
    pub documents: Option<i64>,
    pub switched: bool,
    pub resumed: bool,
    pub dry_run: bool,
    pub offline: bool,
    /// Why a generation stayed `ready` without an automatic switch.
    pub detail: Option<String>,
}

pub async fn rebuild<P: Projection>(
    db: &Db,
    projection: &P,
    options: &RebuildOptions,
    progress: &mut dyn Progress,
    shutdown: &CancellationToken,
) -> Result<RebuildReport, RebuildError> {
    let previous_active = generations::active(db, P::NAME).await?;
    let resumable = generations::in_state(db, P::NAME, &[BUILDING, CATCHING_UP]).await?;
    let resumed = resumable.is_some();
    let opened = match resumable {
        Some(g) => g,
        None => match open::<P>(db, options, previous_active).await? {
            Opened::Generation(g) => g,
            Opened::Planned(positions) => {
                let to_replay = positions.iter().map(|p| u64::try_from(p.boundary_offset - p.next_offset).unwrap_or(0)).sum();
                return Ok(report::<P>(
                    0,
                    previous_active,
                    "planned",
                    options,
                    ReplayProgress { total: to_replay, ..Default::default() },
                    true,
                ));
            }
        },
    };
    let generation = opened.generation;
    let verb = if resumed { "resuming" } else { "building" };
    progress.phase(&format!("{} {verb} generation {generation}: replaying to the boundary", P::NAME));
    // A replay reads history into a generation and nothing else: its span
    // names the generation, and no provider call can be under it
    // (herald-rebuild does not depend on herald-notify).
    let span = tracing::info_span!("rebuild.replay", projection = P::NAME, generation, records = tracing::field::Empty);
    let replayed =
        replay::replay(db, projection, &options.kafka, &options.topic, generation, options.batch, &options.registry, shutdown, |p| {
            progress.replayed(p)
        })
        .instrument(span.clone())
        .await?;
    span.record("records", replayed.done);
    let mut report = report::<P>(generation, previous_active, BUILDING, options, replayed, false);
    report.resumed = resumed;
    report.offline = opened.boundary_mode.as_deref() == Some("offline");
    if shutdown.is_cancelled() {
        return Ok(report);
    }
    // Before the verification reads it: what the replay loaded becomes
    // readable with what live traffic wrote meanwhile.
    progress.phase(&format!("{} generation {generation}: indexing what was replayed", P::NAME));
    if let Some(storage) = projection.seal_load(db, generation).await? {
        generations::record_storage(db, P::NAME, generation, &storage).await?;
    }
    progress.phase(&format!("{} generation {generation}: verifying", P::NAME));
    let rows = match verified(db, projection, &opened, previous_active).await? {
        Verified::Rows(rows) => rows,
        Verified::Unverifiable(rows, why) => {
            generations::record_verification(db, P::NAME, generation, rows, "unverified").await?;
            generations::set_state(db, P::NAME, generation, READY, Some(&why)).await?;
            (report.state, report.documents, report.detail) = (READY.into(), Some(rows), Some(why));
            progress.phase(&format!("{} generation {generation}: ready, not switched", P::NAME));
            return Ok(report);
        }
    };
    report.state = READY.into();
    report.documents = Some(rows);
    if options.switch == SwitchMode::Auto {
        generations::switch_to(db, P::NAME, generation).await?;
        report.state = generations::ACTIVE.into();
        report.switched = true;
        info!(projection = P::NAME, generation, previous_active, "reads switched");
    }
    progress.phase(&format!("{} generation {generation}: {}", P::NAME, report.state));
    Ok(report)
}

fn report<P: Projection>(
    generation: i64,
    previous_active: i64,
    state: &str,
    options: &RebuildOptions,
    replayed: ReplayProgress,
    dry_run: bool,
) -> RebuildReport {
    RebuildReport {
        projection: P::NAME.to_owned(),
        generation,
        previous_active,
        state: state.to_owned(),
        replayed: replayed.done,
        to_replay: replayed.total,
        documents: None,
        switched: false,
        resumed: false,
        dry_run,
        offline: options.offline,
        detail: None,
    }
}

enum Opened {
    Generation(Generation),
    /// A dry run: the positions a generation would get.
    Planned(Vec<Position>),
}

/// Plans and opens the next generation: where it starts (the earliest
/// retained records, or a snapshot), and its boundary (the live positions,
/// or offline at least the end of the topic).
async fn open<P: Projection>(db: &Db, options: &RebuildOptions, previous_active: i64) -> Result<Opened, RebuildError> {
    // Before the topic's end is read: what was delivered then is below it.
    let settled = Settled::now(db).await?;
    let watermarks = watermarks(&options.kafka, &options.topic).await?;
    let (starts, documents) = plan::<P>(db, options, previous_active, &watermarks).await?;
    let boundary = if options.offline { Boundary::Offline { settled } } else { Boundary::Live };
    if options.dry_run {
        let live = herald_store::positions::read(db, P::NAME, &options.topic).await?;
        let planned = starts
            .iter()
            .map(|p| {
                let live = live.get(&p.partition).copied().unwrap_or(0);
                let boundary_offset = if options.offline { live.max(p.boundary_offset) } else { live };
                Position { boundary_offset, ..*p }
            })
            .collect();
        return Ok(Opened::Planned(planned));
    }
    // Only a wait makes sense here: nothing is written yet to fail.
    options.faults.at(Point::BeforeOpen, P::NAME, 0).await;
    let mode = boundary.mode();
    let (generation, positions) = generations::open_next(db, P::NAME, &options.topic, &starts, boundary, &documents).await?;
    info!(projection = P::NAME, generation = generation.generation, ?positions, mode, "generation opened");
    Ok(Opened::Generation(generation))
}

enum Verified {
    /// Agrees: rows reads can find.
    Rows(i64),
    /// Nothing to compare with (offline, no source of truth declared).
    Unverifiable(i64, String),
}

/// Online: the new generation against the active one, in one snapshot.
/// Offline: against the projection's source of truth. A mismatch marks the
/// generation failed; reads stay where they are.
async fn verified<P: Projection>(db: &Db, projection: &P, opened: &Generation, active: i64) -> Result<Verified, RebuildError> {
    let generation = opened.generation;
    let (old, new) = verify::fingerprints(db, projection, active, generation).await?;
    let detail = match (opened.boundary_mode.as_deref(), opened.settled()) {
        (Some("offline"), Some(settled)) => match projection.verify_source(db, generation, &settled).await? {
            None => {
                let why = format!(
                    "offline: {} declares no source of truth to verify against; check, then `herald rebuild switch {}`",
                    P::NAME,
                    P::NAME
                );
                return Ok(Verified::Unverifiable(new.rows, why));
            }
            Some(problems) if problems.is_empty() => None,
            Some(problems) => Some(format!(
                "{} problem(s) against the source of truth: {}",
                problems.len(),
                problems.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
            )),
        },
        _ => (old != new)
            .then(|| format!("{} rows vs {} in the active generation (checksums {} / {})", new.rows, old.rows, new.checksum, old.checksum)),
    };
    if let Some(detail) = detail {
        generations::set_state(db, P::NAME, generation, FAILED, Some(&detail)).await?;
        return Err(RebuildError::Mismatch { generation, active, detail });
    }
    generations::record_verification(db, P::NAME, generation, new.rows, &new.checksum).await?;
    Ok(Verified::Rows(new.rows))
}

/// Where the new generation starts and what it starts with: the earliest
/// retained records and nothing, if they still include everything the active
/// generation was built from; a snapshot's documents and positions, if one
/// is given (and covers what is gone); otherwise a refusal naming the gap.
async fn plan<P: Projection>(
    db: &Db,
    options: &RebuildOptions,
    active: i64,
    watermarks: &[Position],
) -> Result<(Vec<Position>, Vec<DocumentRow>), RebuildError> {
    if let Some(path) = &options.from_snapshot {
        let snapshot = Snapshot::decode(&tokio::fs::read(path).await?)?;
        let starts = snapshot::starts(&snapshot, P::NAME, &options.topic, watermarks)?;
        info!(path = %path.display(), documents = snapshot.documents.len(), "starting from a snapshot");
        return Ok((starts, snapshot.documents));
    }
    let needed = history::needed(db, P::NAME, active, &options.topic).await?;
    let low: Vec<(i32, i64)> = watermarks.iter().map(|p| (p.partition, p.next_offset)).collect();
    let gaps = history::gaps(&options.topic, &needed, &low);
    if !gaps.is_empty() {
        return Err(RebuildError::HistoryGap(gaps));
    }
    Ok((watermarks.to_vec(), Vec::new()))
}

/// Start (low watermark) and end (high watermark) of every partition.
pub async fn watermarks(kafka: &KafkaConfig, topic: &str) -> Result<Vec<Position>, RebuildError> {
    let marks = offsets::watermarks(kafka, topic).await?;
    Ok(marks.into_iter().map(|m| Position { partition: m.partition, next_offset: m.low, boundary_offset: m.high }).collect())
}
