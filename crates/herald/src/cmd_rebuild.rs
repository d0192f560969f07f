//! `herald rebuild …`: build a projection's next generation from retained
//! history, switch reads to it, roll back, and show every generation.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Subcommand, ValueEnum};
use herald_kafka::Topics;
use herald_rebuild::generations::{self, Generation};
use herald_rebuild::replay::{DEFAULT_BATCH, ReplayProgress};
use herald_rebuild::{Progress, Projection, RebuildError, RebuildOptions, RebuildReport, Search, Stats, SwitchMode, rebuild};
use herald_store::Db;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ProjectionName {
    Search,
    Stats,
}

impl ProjectionName {
    const ALL: [ProjectionName; 2] = [ProjectionName::Search, ProjectionName::Stats];

    fn as_str(self) -> &'static str {
        match self {
            ProjectionName::Search => Search::NAME,
            ProjectionName::Stats => Stats::NAME,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SwitchArg {
    Auto,
    Manual,
}

/// Where a projection's database and history are; shared by `herald rebuild`
/// and `herald snapshot`, which must agree on them.
#[derive(Debug, Clone, Args)]
pub struct ProjectionBackends {
    #[command(flatten)]
    pub database: crate::connection::DatabaseArgs,
    #[command(flatten)]
    pub kafka: crate::connection::KafkaArgs,
    #[arg(long, env = "HERALD_TOPIC_PREFIX", global = true)]
    pub topic_prefix: Option<String>,
    #[arg(long, env = "HERALD_GROUP_PREFIX", default_value = "herald", global = true)]
    pub group_prefix: String,
}

#[derive(Debug, Clone, Args)]
pub struct RebuildArgs {
    #[command(flatten)]
    pub on: ProjectionBackends,
    #[command(subcommand)]
    pub command: RebuildCommand,
}

/// How to build a generation.
#[derive(Debug, Clone, Args)]
pub struct BuildArgs {
    #[arg(long, value_enum, default_value = "auto")]
    pub switch: SwitchArg,
    /// Show the boundary and what would be replayed; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Records per replay transaction.
    #[arg(long, default_value_t = DEFAULT_BATCH)]
    pub batch: usize,
    /// The live subscription is stopped or behind: replay to the end of the
    /// topic and verify against the projection's source of truth (search:
    /// the jobs table); live traffic, when it resumes, writes only what the
    /// new generation does not own yet.
    #[arg(long)]
    pub offline: bool,
    /// Progress and the report as JSON lines, for machines.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Subcommand)]
pub enum RebuildCommand {
    /// Build (or resume) search's next generation; switch when verified (--switch auto).
    Search {
        #[command(flatten)]
        build: BuildArgs,
        /// Start from this snapshot (`herald snapshot search --out FILE`): its
        /// documents, then replay from its positions. Required when retention
        /// removed history the active generation was built from.
        #[arg(long, value_name = "FILE")]
        from_snapshot: Option<std::path::PathBuf>,
    },
    /// Build (or resume) stats' next generation; switch when verified (--switch auto).
    Stats {
        #[command(flatten)]
        build: BuildArgs,
    },
    /// Switch reads to the ready generation.
    Switch { projection: ProjectionName },
    /// Return reads to the previous generation.
    Rollback { projection: ProjectionName },
    /// Every generation of every projection.
    Status {
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(args: RebuildArgs) -> anyhow::Result<ExitCode> {
    let db = args.on.database.open("herald rebuild", herald_wiring::connection::Schema::Check).await?;
    match &args.command {
        RebuildCommand::Status { json } => status(&db, *json).await,
        RebuildCommand::Switch { projection } => switch(&db, projection.as_str()).await,
        RebuildCommand::Rollback { projection } => match generations::rollback(&db, projection.as_str()).await {
            Ok(generation) => {
                println!("{}: reads rolled back to generation {generation}", projection.as_str());
                Ok(ExitCode::SUCCESS)
            }
            Err(RebuildError::State(message)) => {
                eprintln!("error: {message}");
                Ok(ExitCode::from(2))
            }
            Err(e) => Err(e.into()),
        },
        RebuildCommand::Search { build, from_snapshot } => build_generation(&db, &args.on, &Search, build, from_snapshot.clone()).await,
        RebuildCommand::Stats { build } => build_generation(&db, &args.on, &Stats, build, None).await,
    }
}

async fn switch(db: &Db, projection: &str) -> anyhow::Result<ExitCode> {
    let Some(ready) = generations::in_state(db, projection, &[generations::READY]).await? else {
        eprintln!("error: {projection} has no ready generation to switch to");
        return Ok(ExitCode::from(2));
    };
    generations::switch_to(db, projection, ready.generation).await?;
    println!("{projection}: reads switched to generation {}", ready.generation);
    Ok(ExitCode::SUCCESS)
}

async fn build_generation<P: Projection>(
    db: &Db,
    on: &ProjectionBackends,
    projection: &P,
    build: &BuildArgs,
    from_snapshot: Option<std::path::PathBuf>,
) -> anyhow::Result<ExitCode> {
    let Some(brokers) = &on.kafka.brokers else {
        eprintln!("error: --kafka (or HERALD_KAFKA_BROKERS) is required: a rebuild replays the broker's history");
        return Ok(ExitCode::from(2));
    };
    if build.batch == 0 {
        eprintln!("error: --batch must be at least 1");
        return Ok(ExitCode::from(2));
    }
    let topics = on.topic_prefix.as_deref().map_or_else(Topics::default, Topics::with_prefix);
    let options = RebuildOptions {
        kafka: on.kafka.connect_to(brokers).await?,
        topic: topics.events,
        switch: match build.switch {
            SwitchArg::Auto => SwitchMode::Auto,
            SwitchArg::Manual => SwitchMode::Manual,
        },
        offline: build.offline,
        dry_run: build.dry_run,
        batch: build.batch,
        from_snapshot,
        faults: herald_fault::Hook::none(),
        registry: herald_envelope::Registry::embedded(),
    };
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(
        async move {
            crate::signals::wait_for_stop().await;
            signal.cancel();
        }
        .in_current_span(),
    );
    let mut progress = Reporter::new(build.json);
    let report = match rebuild::rebuild(db, projection, &options, &mut progress, &shutdown).await {
        Ok(report) => report,
        // The operator's input or the broker's history do not allow a
        // rebuild: say why, write nothing, exit 2.
        Err(e @ (RebuildError::HistoryGap(_) | RebuildError::Snapshot(_) | RebuildError::Io(_))) => {
            progress.finish();
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(e.into()),
    };
    progress.finish();
    print_report(&report, build.json)?;
    Ok(ExitCode::SUCCESS)
}

fn print_report(report: &RebuildReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(&json!({"report": report}))?);
    } else {
        println!("{}", serde_json::to_string(report)?);
    }
    Ok(())
}

async fn status(db: &Db, json: bool) -> anyhow::Result<ExitCode> {
    let mut all: Vec<Generation> = Vec::new();
    for projection in ProjectionName::ALL {
        all.extend(generations::list(db, projection.as_str()).await?);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    } else {
        println!("{:<10} {:>10} {:<12} {:>10}  checksum", "projection", "generation", "state", "rows");
        for g in &all {
            let rows = g.documents.map_or("-".to_owned(), |d| d.to_string());
            println!("{:<10} {:>10} {:<12} {:>10}  {}", g.projection, g.generation, g.state, rows, g.checksum.as_deref().unwrap_or("-"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A progress bar on a terminal (events done of the boundary total, events/s,
/// ETA); plain lines otherwise, which is also what tests read; JSON lines
/// with `--json`.
struct Reporter {
    bar: Option<ProgressBar>,
    started: Instant,
    json: bool,
}

impl Reporter {
    fn new(json: bool) -> Reporter {
        Reporter { bar: None, started: Instant::now(), json }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish();
        }
    }

    fn rate(&self, done: u64) -> f64 {
        done as f64 / self.started.elapsed().as_secs_f64().max(0.001)
    }
}

impl Progress for Reporter {
    fn phase(&mut self, message: &str) {
        self.finish();
        if self.json {
            println!("{}", json!({"phase": message}));
        } else {
            println!("rebuild: {message}");
        }
    }

    fn replayed(&mut self, p: ReplayProgress) {
        if self.json {
            println!(
                "{}",
                json!({"replayed": p.done, "total": p.total, "skipped_undecodable": p.skipped_undecodable, "per_second": self.rate(p.done).round()})
            );
        } else if std::io::stderr().is_terminal() {
            let bar = self.bar.get_or_insert_with(|| {
                let bar = ProgressBar::new(p.total);
                bar.set_style(
                    ProgressStyle::with_template("{bar:40} {pos}/{len} events  {per_sec}  eta {eta}")
                        .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                bar
            });
            bar.set_position(p.done);
        } else {
            println!("rebuild: replayed {} of {} events ({:.0}/s)", p.done, p.total, self.rate(p.done));
        }
    }
}
