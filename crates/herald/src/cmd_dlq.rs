//! `herald dlq list|redrive`: what the subscriptions and the export workers
//! set aside, and putting it back after a fix — a subscription's letter
//! through the same inbox and handler, a worker's command through the export
//! worker itself (run in this process, against the workers' artifact store).

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use herald_consumer::Redriven;
use herald_export::artifact::ArtifactStore;
use herald_export::worker::{self, ExportWorker};
use herald_kafka::Topics;
use herald_store::Db;
use herald_store::dead_letter::{self, DeadLetter};
use serde_json::json;

use crate::lifecycle_args::LifecycleArgs;
use crate::subscriptions::{self, Name};

#[derive(Debug, Clone, Args)]
pub struct DlqArgs {
    /// Database URL (postgres://… or sqlite://…).
    #[arg(long, env = "HERALD_DATABASE_URL", global = true)]
    pub database: Option<String>,
    #[command(subcommand)]
    pub command: DlqCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum DlqCommand {
    /// Dead letters still waiting (with --all, redriven ones too).
    List {
        #[arg(long, value_enum)]
        subscription: Option<Scope>,
        /// Include redriven letters.
        #[arg(long)]
        all: bool,
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Applies dead letters again: one by id, or every dead one of a subscription.
    #[command(group(clap::ArgGroup::new("which").required(true).args(["id", "subscription"])))]
    Redrive {
        /// Id of the dead letter, as `dlq list` shows it.
        id: Option<i64>,
        #[arg(long, value_enum)]
        subscription: Option<Scope>,
        #[command(flatten)]
        worker: WorkerArgs,
    },
}

/// Whose dead letters: a subscription of the events topic, or the export
/// workers (commands).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scope {
    /// Search documents of finished exports.
    Search,
    /// Counters by day, caller and format.
    Stats,
    /// Notification intents, one per completion and recipient.
    Notify,
    /// Export commands the workers could not run.
    ExportWorkers,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Search => Name::Search.as_str(),
            Scope::Stats => Name::Stats.as_str(),
            Scope::Notify => Name::Notify.as_str(),
            Scope::ExportWorkers => worker::SUBSCRIPTION,
        }
    }
}

/// What redriving an export worker's letter needs: the workers' own
/// settings, since the attempt it runs writes their artifact and their
/// completion event.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// The workers' artifact store (a directory or s3://bucket/prefix);
    /// required to redrive export-workers letters.
    #[arg(long, env = "HERALD_ARTIFACTS")]
    pub artifacts: Option<String>,
    /// Prefix of Herald's topic names, as the workers run with it.
    #[arg(long, env = "HERALD_TOPIC_PREFIX")]
    pub topic_prefix: Option<String>,
    #[command(flatten)]
    pub lifecycle: LifecycleArgs,
}

pub async fn run(args: DlqArgs) -> anyhow::Result<ExitCode> {
    let Some(url) = &args.database else {
        eprintln!("error: --database (or HERALD_DATABASE_URL) is required");
        return Ok(ExitCode::from(2));
    };
    let db = Db::connect_and_migrate(url).await.with_context(|| format!("database {url}"))?;
    match args.command {
        DlqCommand::List { subscription, all, json } => list(&db, subscription, all, json).await,
        DlqCommand::Redrive { id: Some(id), worker, .. } => match dead_letter::get(&db, id).await? {
            Some(letter) => redrive_all(&db, vec![letter], &worker).await,
            None => {
                eprintln!("error: no dead letter with id {id}");
                Ok(ExitCode::from(2))
            }
        },
        DlqCommand::Redrive { subscription: Some(scope), worker, .. } => {
            let letters = dead_letter::list(&db, Some(scope.as_str()), Some(dead_letter::DEAD)).await?;
            redrive_all(&db, letters, &worker).await
        }
        DlqCommand::Redrive { .. } => unreachable!("clap requires an id or --subscription"),
    }
}

async fn list(db: &Db, subscription: Option<Scope>, all: bool, as_json: bool) -> anyhow::Result<ExitCode> {
    let status = if all { None } else { Some(dead_letter::DEAD) };
    let letters = dead_letter::list(db, subscription.map(Scope::as_str), status).await?;
    if as_json {
        let rows: Vec<_> = letters.iter().map(to_json).collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:>6}  {:<14} {:<9} {:>3}  {:<36} {:<36} error", "id", "sub", "status", "try", "record", "event id");
    for l in &letters {
        let record = format!("{}/{}@{}", l.topic, l.partition, l.offset);
        let error: String = l.error.chars().take(100).collect();
        println!(
            "{:>6}  {:<14} {:<9} {:>3}  {:<36} {:<36} {}",
            l.id, l.subscription, l.status, l.attempts, record, l.event_id.as_deref().unwrap_or("-"), error
        );
    }
    println!("{} dead letter(s)", letters.len());
    Ok(ExitCode::SUCCESS)
}

fn to_json(l: &DeadLetter) -> serde_json::Value {
    json!({
        "id": l.id, "subscription": l.subscription, "status": l.status, "attempts": l.attempts,
        "source": l.source, "event_id": l.event_id, "event_type": l.event_type,
        "topic": l.topic, "partition": l.partition, "offset": l.offset, "error": l.error,
        "created_at_ms": l.created_at_ms, "updated_at_ms": l.updated_at_ms,
    })
}

/// Exit 0 when every letter ended applied (or already applied / not
/// handled), 1 when one still fails, 2 when a worker's letter cannot be run
/// for want of the workers' settings.
async fn redrive_all(db: &Db, letters: Vec<DeadLetter>, args: &WorkerArgs) -> anyhow::Result<ExitCode> {
    let worker = if letters.iter().any(|l| l.subscription == worker::SUBSCRIPTION && l.status == dead_letter::DEAD) {
        let Some(location) = &args.artifacts else {
            eprintln!("error: redriving a dead letter of {} runs its export: --artifacts (or HERALD_ARTIFACTS) must name the workers' artifact store", worker::SUBSCRIPTION);
            return Ok(ExitCode::from(2));
        };
        Some(export_worker(db, location, args)?)
    } else {
        None
    };
    let mut failed = 0;
    for letter in &letters {
        let outcome = match &worker {
            Some(w) if letter.subscription == worker::SUBSCRIPTION => herald_consumer::redrive_processor(db, w, letter).await?,
            // Only a letter that is no longer dead reaches here without a worker.
            None if letter.subscription == worker::SUBSCRIPTION => Redriven::NotDead,
            _ => subscriptions::redrive(db, letter).await?,
        };
        let text = match &outcome {
            Redriven::Applied => "applied".to_owned(),
            Redriven::AlreadyApplied => "already applied; nothing applied again".to_owned(),
            Redriven::NotHandled => "type not handled by the subscription; marked redriven".to_owned(),
            Redriven::NotDead => "not dead (already redriven)".to_owned(),
            Redriven::Failed(reason) => {
                failed += 1;
                format!("still failing: {reason}")
            }
        };
        println!("dead letter {} ({}): {text}", letter.id, letter.subscription);
    }
    println!("{} redriven, {} still failing", letters.len() - failed, failed);
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// An export worker with the workers' settings, to run redriven commands.
fn export_worker(db: &Db, artifacts: &str, args: &WorkerArgs) -> anyhow::Result<ExportWorker> {
    let store = ArtifactStore::from_location(artifacts).with_context(|| format!("artifact store {artifacts}"))?;
    let topics = args.topic_prefix.as_deref().map_or_else(Topics::default, Topics::with_prefix);
    let options = args.lifecycle.options()?;
    Ok(ExportWorker::new(db.clone(), topics, store, options.policy, options.faults))
}
