//! The rebuild procedure: create (or resume) generation N+1, replay to the
//! boundary, wait until live traffic passed the boundary, verify against the
//! active generation, and switch reads — or stop at `ready`.

use std::time::{Duration, Instant};

use herald_store::Db;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::generations::{self, BUILDING, CATCHING_UP, FAILED, Position};
use crate::history;
use crate::snapshot::{self, Snapshot};
use herald_projections::search::DocumentRow;
use crate::replay::{self, ReplayProgress};
use crate::verify;
use crate::{Projection, RebuildError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchMode {
    /// Switch reads as soon as the new generation verified.
    Auto,
    /// Stop at `ready`; `herald rebuild switch` finishes.
    Manual,
}

#[derive(Debug, Clone)]
pub struct RebuildOptions {
    pub brokers: String,
    pub topic: String,
    /// The live subscription's consumer group, whose progress past the
    /// boundary completes the new generation.
    pub live_group: String,
    pub switch: SwitchMode,
    /// Records the live group may still be short of the boundary (summed over
    /// partitions) when verification starts; 0 means "all of them".
    pub lag_threshold: i64,
    pub catch_up_timeout: Duration,
    /// Plan only: print the boundary and what would be replayed.
    pub dry_run: bool,
    /// Records per replay transaction.
    pub batch: usize,
    /// Start from this snapshot (`herald snapshot search`) instead of the
    /// earliest retained records.
    pub from_snapshot: Option<std::path::PathBuf>,
}

impl Default for RebuildOptions {
    fn default() -> Self {
        RebuildOptions {
            brokers: String::new(),
            topic: String::new(),
            live_group: String::new(),
            switch: SwitchMode::Auto,
            lag_threshold: 0,
            catch_up_timeout: Duration::from_secs(600),
            dry_run: false,
            batch: replay::DEFAULT_BATCH,
            from_snapshot: None,
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
    pub generation: i64,
    pub previous_active: i64,
    pub state: String,
    pub replayed: u64,
    pub to_replay: u64,
    pub documents: Option<i64>,
    pub switched: bool,
    pub resumed: bool,
    pub dry_run: bool,
}

pub async fn rebuild<P: Projection>(db: &Db, options: &RebuildOptions, progress: &mut dyn Progress, shutdown: &CancellationToken) -> Result<RebuildReport, RebuildError> {
    let previous_active = generations::active(db, P::NAME).await?;
    let resumable = generations::in_state(db, P::NAME, &[BUILDING, CATCHING_UP]).await?;
    let resumed = resumable.is_some();
    let generation = match resumable {
        Some(g) => g.generation,
        None => {
            let watermarks = watermarks(&options.brokers, &options.topic).await?;
            let (boundary, documents) = plan::<P>(db, options, previous_active, &watermarks).await?;
            if options.dry_run {
                let to_replay = boundary.iter().map(|p| (p.boundary_offset - p.next_offset).max(0) as u64).sum();
                return Ok(RebuildReport { generation: 0, previous_active, state: "planned".into(), replayed: 0, to_replay, documents: None, switched: false, resumed: false, dry_run: true });
            }
            generations::create_next(db, P::NAME, &options.topic, &boundary, &documents).await?.generation
        }
    };
    progress.phase(&format!("{} generation {generation}: replaying to the boundary", if resumed { "resuming" } else { "building" }));
    let replayed = replay::replay::<P>(db, &options.brokers, &options.topic, generation, options.batch, shutdown, |p| progress.replayed(p)).await?;
    let mut report = RebuildReport { generation, previous_active, state: BUILDING.into(), replayed: replayed.done, to_replay: replayed.total, documents: None, switched: false, resumed, dry_run: false };
    if shutdown.is_cancelled() {
        return Ok(report);
    }
    generations::set_state(db, P::NAME, generation, CATCHING_UP, None).await?;
    progress.phase(&format!("generation {generation}: waiting for live traffic to pass the boundary"));
    wait_for_live::<P>(db, options, generation, shutdown).await?;
    if shutdown.is_cancelled() {
        report.state = CATCHING_UP.into();
        return Ok(report);
    }
    let (active, fresh) = verify::fingerprints(db, previous_active, generation).await?;
    if active != fresh {
        let detail = format!("{} documents vs {} in the active generation (checksums {} / {})", fresh.documents, active.documents, fresh.checksum, active.checksum);
        generations::set_state(db, P::NAME, generation, FAILED, Some(&detail)).await?;
        return Err(RebuildError::Mismatch { generation, active: previous_active, detail });
    }
    generations::record_verification(db, P::NAME, generation, fresh.documents, &fresh.checksum).await?;
    report.state = generations::READY.into();
    report.documents = Some(fresh.documents);
    if options.switch == SwitchMode::Auto {
        generations::switch_to(db, P::NAME, generation).await?;
        report.state = generations::ACTIVE.into();
        report.switched = true;
        info!(generation, previous_active, "reads switched");
    }
    progress.phase(&format!("generation {generation}: {}", report.state));
    Ok(report)
}

/// Where the new generation starts and what it starts with: the earliest
/// retained records and nothing, if they still include everything the active
/// generation was built from; a snapshot's documents and positions, if one
/// is given (and covers what is gone); otherwise a refusal naming the gap.
async fn plan<P: Projection>(db: &Db, options: &RebuildOptions, active: i64, watermarks: &[Position]) -> Result<(Vec<Position>, Vec<DocumentRow>), RebuildError> {
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

/// Waits until the live group's committed offsets are within the lag
/// threshold of the boundary: from then on both generations have seen the
/// same events.
async fn wait_for_live<P: Projection>(db: &Db, options: &RebuildOptions, generation: i64, shutdown: &CancellationToken) -> Result<(), RebuildError> {
    let positions = generations::positions(db, P::NAME, generation).await?;
    let started = Instant::now();
    loop {
        let committed = committed_offsets(&options.brokers, &options.live_group, &options.topic, &positions).await?;
        let lag: i64 = positions.iter().zip(&committed).map(|(p, c)| (p.boundary_offset - c).max(0)).sum();
        if lag <= options.lag_threshold || shutdown.is_cancelled() {
            return Ok(());
        }
        if started.elapsed() > options.catch_up_timeout {
            return Err(RebuildError::CatchUpTimeout(options.catch_up_timeout, format!("group {} is {lag} records short", options.live_group)));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Start (low watermark) and boundary (high watermark) of every partition.
pub async fn watermarks(brokers: &str, topic: &str) -> Result<Vec<Position>, RebuildError> {
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = ClientConfig::new().set("bootstrap.servers", &brokers).create()?;
        let timeout = Duration::from_secs(30);
        let metadata = client.fetch_metadata(Some(&topic), timeout)?;
        let mut out = Vec::new();
        for t in metadata.topics() {
            for p in t.partitions() {
                let (low, high) = client.fetch_watermarks(&topic, p.id(), timeout)?;
                out.push(Position { partition: p.id(), next_offset: low, boundary_offset: high });
            }
        }
        out.sort_by_key(|p| p.partition);
        Ok(out)
    })
    .await
    .map_err(|e| RebuildError::State(format!("watermark thread: {e}")))?
}

/// The group's committed offset per partition of `positions` (0 if none).
async fn committed_offsets(brokers: &str, group: &str, topic: &str, positions: &[Position]) -> Result<Vec<i64>, RebuildError> {
    let (brokers, group, topic) = (brokers.to_owned(), group.to_owned(), topic.to_owned());
    let partitions: Vec<i32> = positions.iter().map(|p| p.partition).collect();
    tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = ClientConfig::new().set("bootstrap.servers", &brokers).set("group.id", &group).create()?;
        let mut tpl = TopicPartitionList::new();
        for p in &partitions {
            tpl.add_partition(&topic, *p);
        }
        let committed = client.committed_offsets(tpl, Duration::from_secs(30))?;
        Ok(partitions
            .iter()
            .map(|p| match committed.find_partition(&topic, *p).map(|e| e.offset()) {
                Some(Offset::Offset(n)) => n,
                _ => 0,
            })
            .collect())
    })
    .await
    .map_err(|e| RebuildError::State(format!("offsets thread: {e}")))?
}
