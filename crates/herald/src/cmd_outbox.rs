//! `herald outbox list|redrive`: what the relay set aside, and putting it
//! back in line.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use herald_store::{Db, outbox};
use serde_json::json;

#[derive(Debug, Clone, Args)]
pub struct OutboxArgs {
    #[command(flatten)]
    pub database: crate::connection::DatabaseArgs,
    #[command(subcommand)]
    pub command: OutboxCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum OutboxCommand {
    /// Rows in one status, oldest first.
    List {
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(outbox::STATUSES))]
        status: String,
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..))]
        limit: i64,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Re-append set-aside rows (failed, dead_lettered) as pending, with the
    /// same CloudEvents id; they are published after what is pending now.
    Redrive {
        /// Sequence numbers of the rows.
        #[arg(long = "seq", num_args = 1.., required_unless_present = "status", conflicts_with = "status")]
        seqs: Vec<i64>,
        /// Every row in this status.
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(outbox::REDRIVABLE))]
        status: Option<String>,
    },
}

pub async fn run(args: OutboxArgs) -> anyhow::Result<ExitCode> {
    let db = args.database.open("herald outbox", herald_wiring::connection::Schema::Check).await?;
    match args.command {
        OutboxCommand::List { status, limit, json } => list(&db, &status, limit, json).await,
        OutboxCommand::Redrive { seqs, status } => {
            let seqs = match status {
                Some(status) => outbox::seqs_with_status(&db, &status).await?,
                None => seqs,
            };
            let moved = outbox::redrive(&db, &seqs).await?;
            for (old, new) in &moved {
                println!("redrove seq {old} as seq {new}");
            }
            println!("{} of {} rows redriven", moved.len(), seqs.len());
            // Asking for rows that are not set aside is the caller's mistake.
            Ok(if moved.len() == seqs.len() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
    }
}

async fn list(db: &Db, status: &str, limit: i64, as_json: bool) -> anyhow::Result<ExitCode> {
    let rows = outbox::list(db, status, limit).await?;
    if as_json {
        for r in &rows {
            let line = json!({"seq": r.seq, "source": r.source, "id": r.event_id, "type": r.event_type,
                "topic": r.topic, "key": r.partition_key, "status": r.status, "attempts": r.attempts,
                "last_error": r.last_error, "created_at_ms": r.created_at_ms, "next_attempt_at_ms": r.next_attempt_at_ms});
            println!("{line}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:>8}  {:<16}  {:<36}  {:<24}  {:>8}  last error", "seq", "status", "id", "key", "attempts");
    for r in &rows {
        println!(
            "{:>8}  {:<16}  {:<36}  {:<24}  {:>8}  {}",
            r.seq,
            r.status,
            r.event_id,
            r.partition_key,
            r.attempts,
            r.last_error.as_deref().unwrap_or("")
        );
    }
    Ok(ExitCode::SUCCESS)
}
