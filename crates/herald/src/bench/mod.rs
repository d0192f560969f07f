//! `herald bench …`: measurements printed as one table from one run.
//!
//! - [`consume`]: the search subscription against raw consume and raw
//!   batched insert rates of the same records and rows.
//! - [`workload`]: the records they (and tests) publish.

pub mod consume;
pub mod workload;

use std::process::ExitCode;

use clap::{Args, Subcommand};

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum BenchCommand {
    /// Events/s into the search projection with inbox, vs raw consume and raw insert.
    Consume(consume::ConsumeBenchArgs),
}

pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        BenchCommand::Consume(args) => consume::run(args).await,
    }
}
