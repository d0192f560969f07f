//! `herald rebuild …`: build a projection's next generation from retained
//! history, switch reads to it, roll back, and show every generation.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use herald_kafka::Topics;
use herald_rebuild::generations::{self, Generation};
use herald_rebuild::replay::{DEFAULT_BATCH, ReplayProgress};
use herald_rebuild::{Progress, RebuildError, RebuildOptions, Search, SwitchMode, rebuild};
use herald_store::Db;
use indicatif::{ProgressBar, ProgressStyle};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ProjectionName {
    Search,
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
    #[arg(long, env = "HERALD_DATABASE_URL", global = true)]
    pub database: Option<String>,
    #[arg(long, env = "HERALD_KAFKA_BROKERS", global = true)]
    pub kafka: Option<String>,
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

#[derive(Debug, Clone, Subcommand)]
pub enum RebuildCommand {
    /// Build (or resume) the next generation; switch when verified (--switch auto).
    Search {
        #[arg(long, value_enum, default_value = "auto")]
        switch: SwitchArg,
        /// Show the boundary and what would be replayed; write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Records per replay transaction.
        #[arg(long, default_value_t = DEFAULT_BATCH)]
        batch: usize,
        /// Records the live subscription may still lack when verification starts.
        #[arg(long, default_value_t = 0)]
        lag_threshold: i64,
        #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
        catch_up_timeout: Duration,
        /// Start from this snapshot (`herald snapshot search --out FILE`): its
        /// documents, then replay from its positions. Required when retention
        /// removed history the active generation was built from.
        #[arg(long, value_name = "FILE")]
        from_snapshot: Option<std::path::PathBuf>,
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
    let Some(url) = &args.on.database else {
        eprintln!("error: --database (or HERALD_DATABASE_URL) is required");
        return Ok(ExitCode::from(2));
    };
    let db = Db::connect_and_migrate(url).await?;
    match &args.command {
        RebuildCommand::Status { json } => status(&db, *json).await,
        RebuildCommand::Switch { .. } => {
            let Some(ready) = generations::in_state(&db, "search", &[generations::READY]).await? else {
                eprintln!("error: search has no ready generation to switch to");
                return Ok(ExitCode::from(2));
            };
            generations::switch_to(&db, "search", ready.generation).await?;
            println!("search: reads switched to generation {}", ready.generation);
            Ok(ExitCode::SUCCESS)
        }
        RebuildCommand::Rollback { .. } => match generations::rollback(&db, "search").await {
            Ok(generation) => {
                println!("search: reads rolled back to generation {generation}");
                Ok(ExitCode::SUCCESS)
            }
            Err(herald_rebuild::RebuildError::State(message)) => {
                eprintln!("error: {message}");
                Ok(ExitCode::from(2))
            }
            Err(e) => Err(e.into()),
        },
        RebuildCommand::Search { switch, dry_run, batch, lag_threshold, catch_up_timeout, from_snapshot } => {
            let Some(brokers) = &args.on.kafka else {
                eprintln!("error: --kafka (or HERALD_KAFKA_BROKERS) is required: a rebuild replays the broker's history");
                return Ok(ExitCode::from(2));
            };
            let topics = args.on.topic_prefix.as_deref().map_or_else(Topics::default, Topics::with_prefix);
            let options = RebuildOptions {
                brokers: brokers.clone(),
                topic: topics.events,
                live_group: format!("{}.search", args.on.group_prefix),
                switch: match switch {
                    SwitchArg::Auto => SwitchMode::Auto,
                    SwitchArg::Manual => SwitchMode::Manual,
                },
                lag_threshold: *lag_threshold,
                catch_up_timeout: *catch_up_timeout,
                dry_run: *dry_run,
                batch: *batch,
                from_snapshot: from_snapshot.clone(),
            };
            let shutdown = CancellationToken::new();
            let signal = shutdown.clone();
            tokio::spawn(async move {
                crate::signals::wait_for_stop().await;
                signal.cancel();
            });
            let mut progress = Reporter::new();
            let report = match rebuild::rebuild::<Search>(&db, &options, &mut progress, &shutdown).await {
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
            println!("{}", serde_json::to_string(&report)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn status(db: &Db, json: bool) -> anyhow::Result<ExitCode> {
    let all: Vec<Generation> = generations::list(db, "search").await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    } else {
        println!("{:<10} {:>10} {:<12} {:>10}  checksum", "projection", "generation", "state", "documents");
        for g in &all {
            let docs = g.documents.map_or("-".to_owned(), |d| d.to_string());
            println!("{:<10} {:>10} {:<12} {:>10}  {}", g.projection, g.generation, g.state, docs, g.checksum.as_deref().unwrap_or("-"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A progress bar on a terminal (events done of the boundary total, events/s,
/// ETA); plain lines otherwise, which is also what tests read.
struct Reporter {
    bar: Option<ProgressBar>,
    started: Instant,
}

impl Reporter {
    fn new() -> Reporter {
        Reporter { bar: None, started: Instant::now() }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish();
        }
    }
}

impl Progress for Reporter {
    fn phase(&mut self, message: &str) {
        self.finish();
        println!("rebuild: {message}");
    }

    fn replayed(&mut self, p: ReplayProgress) {
        if std::io::stderr().is_terminal() {
            let bar = self.bar.get_or_insert_with(|| {
                let bar = ProgressBar::new(p.total);
                bar.set_style(
                    ProgressStyle::with_template("{bar:40} {pos}/{len} events  {per_sec}  eta {eta}").unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                bar
            });
            bar.set_position(p.done);
        } else {
            let rate = p.done as f64 / self.started.elapsed().as_secs_f64().max(0.001);
            println!("rebuild: replayed {} of {} events ({rate:.0}/s)", p.done, p.total);
        }
    }
}
