//! `herald bench …`: measurements that are run by hand, not tests. Each
//! prints one table from one run (or one JSON object with `--json`).

mod relay;

use std::process::ExitCode;

use clap::{Args, Subcommand};

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchWhat,
}

#[derive(Debug, Clone, Subcommand)]
pub enum BenchWhat {
    /// Outbox → Kafka: a raw producer, a naive relay and Herald's relay.
    Relay(relay::RelayBenchArgs),
}

pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    match args.what {
        BenchWhat::Relay(args) => relay::run(args).await,
    }
}
