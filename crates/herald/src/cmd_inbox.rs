//! `herald inbox cleanup`: inbox retention. A row may go only once no
//! delivery of its record can still arrive — see ARCHITECTURE.md, "Inbox
//! retention": older than the events topic's retention (read from the
//! broker) plus a redrive window; anything shorter is refused (exit 2)
//! unless `--force`.

use std::process::ExitCode;

use std::time::Duration;

use clap::{Args, Subcommand};
use herald_kafka::Topics;
use herald_store::prune::Kind;
use herald_wiring::prune::{PruneOptions, prune};
use herald_wiring::retention::{self, TopicRetention};
use tokio_util::sync::CancellationToken;

use crate::subscriptions::Name;

#[derive(Debug, Clone, Args)]
pub struct InboxArgs {
    #[command(flatten)]
    pub database: crate::connection::DatabaseArgs,
    /// The cluster whose events topic's retention sets the floor.
    #[command(flatten)]
    pub kafka: crate::connection::KafkaArgs,
    #[command(subcommand)]
    pub command: InboxCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum InboxCommand {
    /// Deletes inbox rows processed more than --older-than-days ago.
    Cleanup {
        /// Age in days; at least the events topic's retention (read from
        /// the broker) plus --redrive-window-days.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        older_than_days: u32,
        #[arg(long, value_enum)]
        subscription: Option<Name>,
        /// How long after the broker dropped a record a redrive may still
        /// deliver it again.
        #[arg(long, default_value_t = retention::DEFAULT_REDRIVE_WINDOW_DAYS)]
        redrive_window_days: u32,
        /// Prefix of Herald's topic names, as the subscriptions run with it.
        #[arg(long, env = "HERALD_TOPIC_PREFIX")]
        topic_prefix: Option<String>,
        /// Remove the rows even below the floor: a record delivered again
        /// after its row is gone has a second effect.
        #[arg(long)]
        force: bool,
    },
}

pub async fn run(args: InboxArgs) -> anyhow::Result<ExitCode> {
    let InboxCommand::Cleanup { older_than_days, subscription, redrive_window_days, topic_prefix, force } = args.command;
    let day = |n: u32| Duration::from_secs(u64::from(n) * 86_400);
    if !force {
        let topic = topic_prefix.as_deref().map_or_else(Topics::default, Topics::with_prefix).events;
        let kafka = args.kafka.connect().await?;
        let kept = TopicRetention::read(kafka.as_ref(), &topic).await;
        if let Err(refusal) = retention::check("inbox rows", day(older_than_days), &topic, &kept, day(redrive_window_days)) {
            eprintln!("error: {refusal}");
            return Ok(ExitCode::from(2));
        }
    }
    let db = args.database.open("herald inbox", herald_wiring::connection::Schema::Check).await?;
    // The same pass as `herald prune --only inbox`: the inbox horizon is
    // raised first, so the audit checks inbox rows only above it from now on.
    let options = PruneOptions {
        retention: day(older_than_days),
        kinds: vec![Kind::Inbox],
        idle_ratio: 0.0,
        inbox_of: subscription.map(|s| s.as_str().to_owned()),
        ..PruneOptions::default()
    };
    let pruned = prune(&db, &options, &CancellationToken::new()).await?;
    let deleted = pruned.removed.get(&Kind::Inbox).copied().unwrap_or(0);
    println!("deleted {deleted} inbox row(s) processed more than {older_than_days} day(s) ago");
    Ok(ExitCode::SUCCESS)
}
