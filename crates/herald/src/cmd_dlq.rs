//! `herald dlq list|redrive|discard`: what the subscriptions and the export
//! workers set aside, and putting it back after a fix — a subscription's
//! letter through the same inbox and handler, a worker's command through the
//! export worker itself (run in this process, against the workers' artifact
//! store) — or giving up on it. Redriving or discarding a subscription's
//! letter also applies the records parked behind it (per-key order), in
//! this process, in the same transaction.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use herald_consumer::{Discarded, Redriven, Released};
use herald_envelope::Registry;
use herald_export::artifact::ArtifactStore;
use herald_export::worker::{self, ExportWorker};
use herald_kafka::Topics;
use herald_notify::intents::NotifyHandler;
use herald_store::Db;
use herald_store::dead_letter::{self, DeadLetter};
use herald_store::parked;
use serde_json::json;

use crate::lifecycle_args::LifecycleArgs;
use crate::subscriptions::{self, Name};

#[derive(Debug, Clone, Args)]
pub struct DlqArgs {
    #[command(flatten)]
    pub database: crate::connection::DatabaseArgs,
    /// The sources the subscriptions accept: a redrive applies a letter
    /// only if its subscription would have.
    #[command(flatten)]
    pub sources: crate::config::SourceArgs,
    #[command(subcommand)]
    pub command: DlqCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum DlqCommand {
    /// Dead letters still waiting (with --all, redriven and discarded ones
    /// too), with the records parked behind each.
    List {
        #[arg(long, value_enum)]
        subscription: Option<Scope>,
        /// Include redriven and discarded letters.
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
    /// Gives up on one dead letter: it is never applied, and the records of
    /// its key parked behind it are applied now, in order.
    Discard {
        /// Id of the dead letter, as `dlq list` shows it.
        id: i64,
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
    let registry = args.sources.registry()?;
    let notify = args.sources.notify_handler()?;
    let db = args.database.open("herald dlq", herald_wiring::connection::Schema::Check).await?;
    match args.command {
        DlqCommand::List { subscription, all, json } => list(&db, subscription, all, json).await,
        DlqCommand::Redrive { id: Some(id), worker, .. } => match dead_letter::get(&db, id).await? {
            Some(letter) => redrive_all(&db, &registry, &notify, vec![letter], &worker).await,
            None => {
                eprintln!("error: no dead letter with id {id}");
                Ok(ExitCode::from(2))
            }
        },
        DlqCommand::Redrive { subscription: Some(scope), worker, .. } => {
            let letters = dead_letter::list(&db, Some(scope.as_str()), Some(dead_letter::DEAD)).await?;
            redrive_all(&db, &registry, &notify, letters, &worker).await
        }
        DlqCommand::Redrive { .. } => unreachable!("clap requires an id or --subscription"),
        DlqCommand::Discard { id } => discard(&db, &registry, &notify, id).await,
    }
}

/// Exit 0 when discarded, 1 when releasing its parked records failed
/// retryably (nothing changed), 2 for an unknown id or a letter that is not
/// dead.
async fn discard(db: &Db, registry: &Registry, notify: &NotifyHandler, id: i64) -> anyhow::Result<ExitCode> {
    let Some(letter) = dead_letter::get(db, id).await? else {
        eprintln!("error: no dead letter with id {id}");
        return Ok(ExitCode::from(2));
    };
    let outcome = if letter.subscription == worker::SUBSCRIPTION {
        // The export workers run one record at a time and park nothing.
        let mut tx = db.begin().await?;
        let marked = dead_letter::mark_discarded(&mut tx, letter.id).await?;
        tx.commit().await?;
        if marked { Discarded::Discarded(Released::default()) } else { Discarded::NotDead }
    } else {
        subscriptions::discard(db, registry, notify, &letter).await?
    };
    match outcome {
        Discarded::Discarded(released) => {
            println!("dead letter {id} ({}): discarded{}", letter.subscription, released_text(&released));
            Ok(ExitCode::SUCCESS)
        }
        Discarded::NotDead => {
            let now = dead_letter::get(db, id).await?.map_or_else(|| letter.status.clone(), |l| l.status);
            eprintln!("error: dead letter {id} is {now}, not dead: only a dead letter can be discarded");
            Ok(ExitCode::from(2))
        }
        Discarded::Failed(reason) => {
            println!("dead letter {id} ({}): not discarded, releasing its parked records failed: {reason}", letter.subscription);
            Ok(ExitCode::FAILURE)
        }
    }
}

/// What became of the records parked behind a letter, as a sentence tail.
fn released_text(r: &Released) -> String {
    let total = r.applied + r.duplicates + r.skipped + u64::from(r.dead_lettered.is_some());
    if total == 0 && r.still_parked == 0 {
        return String::new();
    }
    let mut text =
        format!("; released {total} parked record(s): {} applied, {} already applied, {} not handled", r.applied, r.duplicates, r.skipped);
    if let Some(offset) = r.dead_lettered {
        text.push_str(&format!("; the record at offset {offset} failed and is a dead letter now"));
    }
    if r.still_parked > 0 {
        text.push_str(&format!("; {} still parked behind it", r.still_parked));
    }
    text
}

async fn list(db: &Db, subscription: Option<Scope>, all: bool, as_json: bool) -> anyhow::Result<ExitCode> {
    let status = if all { None } else { Some(dead_letter::DEAD) };
    let letters = dead_letter::list(db, subscription.map(Scope::as_str), status).await?;
    let parked = parked::counts(db).await?;
    let parked_behind = |l: &DeadLetter| match (&l.record_key, l.status == dead_letter::DEAD) {
        (Some(key), true) => parked.get(&(l.subscription.clone(), l.topic.clone(), l.partition, key.clone())).copied().unwrap_or(0),
        _ => 0,
    };
    if as_json {
        let rows: Vec<_> = letters.iter().map(|l| to_json(l, parked_behind(l))).collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:>6}  {:<14} {:<9} {:>3}  {:<36} {:<36} {:>6}  error", "id", "sub", "status", "try", "record", "event id", "parked");
    for l in &letters {
        let record = format!("{}/{}@{}", l.topic, l.partition, l.offset);
        let error: String = l.error.chars().take(100).collect();
        println!(
            "{:>6}  {:<14} {:<9} {:>3}  {:<36} {:<36} {:>6}  {}",
            l.id,
            l.subscription,
            l.status,
            l.attempts,
            record,
            l.event_id.as_deref().unwrap_or("-"),
            parked_behind(l),
            error
        );
    }
    println!("{} dead letter(s)", letters.len());
    Ok(ExitCode::SUCCESS)
}

/// `parked`: records of the letter's key parked behind it (per-key order).
fn to_json(l: &DeadLetter, parked: i64) -> serde_json::Value {
    json!({
        "id": l.id, "subscription": l.subscription, "status": l.status, "attempts": l.attempts,
        "source": l.source, "event_id": l.event_id, "event_type": l.event_type,
        "topic": l.topic, "partition": l.partition, "offset": l.offset, "error": l.error,
        "record_key": l.record_key.as_deref().map(parked::display_key), "parked": parked,
        "created_at_ms": l.created_at_ms, "updated_at_ms": l.updated_at_ms,
    })
}

/// Exit 0 when every letter ended applied (or already applied / not
/// handled), 1 when one still fails, 2 when a worker's letter cannot be run
/// for want of the workers' settings.
async fn redrive_all(
    db: &Db,
    registry: &Registry,
    notify: &NotifyHandler,
    letters: Vec<DeadLetter>,
    args: &WorkerArgs,
) -> anyhow::Result<ExitCode> {
    let worker = if letters.iter().any(|l| l.subscription == worker::SUBSCRIPTION && l.status == dead_letter::DEAD) {
        let Some(location) = &args.artifacts else {
            eprintln!(
                "error: redriving a dead letter of {} runs its export: --artifacts (or HERALD_ARTIFACTS) must name the workers' artifact store",
                worker::SUBSCRIPTION
            );
            return Ok(ExitCode::from(2));
        };
        Some(export_worker(db, location, args)?)
    } else {
        None
    };
    let mut failed = 0;
    for letter in &letters {
        let (outcome, released) = match &worker {
            Some(w) if letter.subscription == worker::SUBSCRIPTION => {
                (herald_consumer::redrive_processor(db, w, letter).await?, Released::default())
            }
            // Only a letter that is no longer dead reaches here without a worker.
            None if letter.subscription == worker::SUBSCRIPTION => (Redriven::NotDead, Released::default()),
            _ => {
                let done = subscriptions::redrive(db, registry, notify, letter).await?;
                (done.redriven, done.released)
            }
        };
        let text = match &outcome {
            Redriven::Applied => "applied".to_owned(),
            Redriven::AlreadyApplied => "already applied; nothing applied again".to_owned(),
            Redriven::NotHandled => "type not handled by the subscription; marked redriven".to_owned(),
            Redriven::NotDead => "not dead (already redriven or discarded)".to_owned(),
            Redriven::Failed(reason) => {
                failed += 1;
                format!("still failing: {reason}")
            }
        };
        println!("dead letter {} ({}): {text}{}", letter.id, letter.subscription, released_text(&released));
    }
    println!("{} redriven, {} still failing", letters.len() - failed, failed);
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// An export worker with the workers' settings, to run redriven commands.
fn export_worker(db: &Db, artifacts: &str, args: &WorkerArgs) -> anyhow::Result<ExportWorker> {
    let store = ArtifactStore::from_location(artifacts).with_context(|| format!("artifact store {artifacts}"))?;
    let topics = args.topic_prefix.as_deref().map_or_else(Topics::default, Topics::with_prefix);
    let options = args.lifecycle.options()?;
    Ok(ExportWorker::new(db.clone(), topics, store, options.policy, herald_fault::from_env()?))
}
