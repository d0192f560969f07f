//! `herald snapshot search --out FILE`: the active search generation's
//! documents with the positions they are consistent with, checksummed — what
//! `herald rebuild search --from-snapshot FILE` starts from when retention
//! removed older history.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use herald_kafka::Topics;
use herald_rebuild::{RebuildError, Search, snapshot};

use crate::cmd_rebuild::ProjectionBackends;

#[derive(Debug, Clone, Args)]
pub struct SnapshotArgs {
    #[command(flatten)]
    pub on: ProjectionBackends,
    #[command(subcommand)]
    pub command: SnapshotCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum SnapshotCommand {
    /// Export the active search generation (documents and tombstones).
    Search {
        /// File to write (replaced only once complete).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
}

pub async fn run(args: SnapshotArgs) -> anyhow::Result<ExitCode> {
    let (Some(url), Some(brokers)) = (&args.on.database.url, &args.on.kafka.brokers) else {
        eprintln!(
            "error: --database and --kafka (or HERALD_DATABASE_URL, HERALD_KAFKA_BROKERS) are required: a snapshot pairs documents with the live group's positions"
        );
        return Ok(ExitCode::from(2));
    };
    let SnapshotCommand::Search { out } = &args.command;
    let db = crate::connection::open_database(url, crate::connection::Schema::Check).await?;
    let kafka = args.on.kafka.connect_to(brokers).await?;
    let topics = args.on.topic_prefix.as_deref().map_or_else(Topics::default, Topics::with_prefix);
    let group = format!("{}.search", args.on.group_prefix);
    let taken = match snapshot::take::<Search>(&db, &kafka, &group, &topics.events).await {
        Ok(taken) => taken,
        Err(e @ RebuildError::Snapshot(_)) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(e.into()),
    };
    // Written aside then renamed: a crash never leaves a half file under the name.
    let partial = out.with_extension("partial");
    tokio::fs::write(&partial, taken.encode()?).await?;
    tokio::fs::rename(&partial, out).await?;
    let positions: Vec<String> = taken.positions.iter().map(|p| format!("{}:{}", p.partition, p.next_offset)).collect();
    println!(
        "snapshot of search generation {}: {} row(s) at positions {} written to {}",
        taken.generation,
        taken.documents.len(),
        positions.join(","),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}
