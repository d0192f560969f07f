//! `herald dlq list|redrive`: what the subscriptions set aside, and putting
//! it back through the same inbox and handler after a fix.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use herald_consumer::Redriven;
use herald_store::Db;
use herald_store::dead_letter::{self, DeadLetter};
use serde_json::json;

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
        subscription: Option<Name>,
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
        subscription: Option<Name>,
    },
}

pub async fn run(args: DlqArgs) -> anyhow::Result<ExitCode> {
    let Some(url) = &args.database else {
        eprintln!("error: --database (or HERALD_DATABASE_URL) is required");
        return Ok(ExitCode::from(2));
    };
    let db = Db::connect_and_migrate(url).await.with_context(|| format!("database {url}"))?;
    match args.command {
        DlqCommand::List { subscription, all, json } => list(&db, subscription, all, json).await,
        DlqCommand::Redrive { id: Some(id), .. } => match dead_letter::get(&db, id).await? {
            Some(letter) => redrive_all(&db, vec![letter]).await,
            None => {
                eprintln!("error: no dead letter with id {id}");
                Ok(ExitCode::from(2))
            }
        },
        DlqCommand::Redrive { subscription: Some(name), .. } => {
            let letters = dead_letter::list(&db, Some(name.as_str()), Some(dead_letter::DEAD)).await?;
            redrive_all(&db, letters).await
        }
        DlqCommand::Redrive { .. } => unreachable!("clap requires an id or --subscription"),
    }
}

async fn list(db: &Db, subscription: Option<Name>, all: bool, as_json: bool) -> anyhow::Result<ExitCode> {
    let status = if all { None } else { Some(dead_letter::DEAD) };
    let letters = dead_letter::list(db, subscription.map(Name::as_str), status).await?;
    if as_json {
        let rows: Vec<_> = letters.iter().map(to_json).collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:>6}  {:<8} {:<9} {:>3}  {:<36} {:<36} error", "id", "sub", "status", "try", "record", "event id");
    for l in &letters {
        let record = format!("{}/{}@{}", l.topic, l.partition, l.offset);
        let error: String = l.error.chars().take(100).collect();
        println!(
            "{:>6}  {:<8} {:<9} {:>3}  {:<36} {:<36} {}",
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
/// handled), 1 when one still fails.
async fn redrive_all(db: &Db, letters: Vec<DeadLetter>) -> anyhow::Result<ExitCode> {
    let mut failed = 0;
    for letter in &letters {
        let outcome = subscriptions::redrive(db, letter).await?;
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
