//! `herald inbox cleanup`: inbox retention. A row may go only once no
//! delivery of its record can still arrive — see ARCHITECTURE.md, "Inbox
//! retention": older than the topic's retention plus the longest redelivery
//! window (consumer lag, rewinds, redrives) with a margin.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use herald_store::{inbox, now_ms};

use crate::subscriptions::Name;

#[derive(Debug, Clone, Args)]
pub struct InboxArgs {
    #[command(flatten)]
    pub database: crate::connection::DatabaseArgs,
    #[command(subcommand)]
    pub command: InboxCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum InboxCommand {
    /// Deletes inbox rows processed more than --older-than-days ago.
    Cleanup {
        /// Age in days; must exceed the events topic's retention plus the
        /// longest redelivery window (default topic retention is 7 days).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        older_than_days: u32,
        #[arg(long, value_enum)]
        subscription: Option<Name>,
    },
}

pub async fn run(args: InboxArgs) -> anyhow::Result<ExitCode> {
    let db = args.database.open("herald inbox", true).await?;
    match args.command {
        InboxCommand::Cleanup { older_than_days, subscription } => {
            let before = now_ms() - i64::from(older_than_days) * 86_400_000;
            let deleted = inbox::delete_older_than(&db, before, subscription.map(Name::as_str)).await?;
            println!("deleted {deleted} inbox row(s) processed more than {older_than_days} day(s) ago");
        }
    }
    Ok(ExitCode::SUCCESS)
}
