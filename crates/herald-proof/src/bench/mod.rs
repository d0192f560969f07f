//! `herald bench …`: measurements run by hand, not tests. Each prints one
//! table from one run (or one JSON object with `--json`).
//!
//! - `relay`: outbox → Kafka against a raw producer and a naive relay.
//! - [`consume`]: the search subscription against raw consume and raw
//!   batched insert rates of the same records and rows.
//! - [`rebuild`]: replay into a new search generation, next to the live
//!   subscription and the raw batched insert in the same run.
//! - `search`: search latency over 1M documents, the relay beside a search flood.
//! - `status`: one status refresh over 10M outbox rows.
//! - `prune`: the relay and the search subscription beside a prune of a million rows.
//! - `latency`: commit → readable search document at fixed offered loads, per stage.
//! - `scale`: relay and consume throughput with 1, 2 and 4 processes on a real cluster.
//! - `peers`: Herald's relay beside Debezium's outbox router on the same rows.
//! - [`workload`]: the records they (and tests) publish.

mod broker;
pub mod consume;
mod cpu;
mod decode_floor;
mod latency;
mod latency_observer;
mod latency_parts;
mod latency_reader;
mod memory;
mod peers;
mod probes;
mod prune;
pub mod rebuild;
mod rebuild_floor;
mod relay;
mod relay_floor;
mod scale;
mod search;
mod search_load;
mod search_report;
mod status;
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
    /// Outbox → Kafka: a raw producer, a naive relay and Herald's relay.
    Relay(relay::RelayBenchArgs),
    /// Events/s into the search projection with inbox, vs raw consume and raw insert.
    Consume(consume::ConsumeBenchArgs),
    /// Events/s of a rebuild's replay into a new generation, vs the live subscription and raw insert.
    Rebuild(rebuild::RebuildBenchArgs),
    /// Search latency over a million documents, and the relay's rate while clients flood search.
    Search(search::SearchBenchArgs),
    /// One status refresh over 10M outbox rows and 1M intents, per part.
    Status(status::StatusBenchArgs),
    /// The relay's and the search subscription's rates during a prune of a million rows, vs quiet.
    Prune(prune::PruneBenchArgs),
    /// Commit → readable search document at offered loads (default 1,000 and 10,000 events/s), per stage.
    Latency(latency::LatencyBenchArgs),
    /// Relay and consume throughput with 1, 2 and 4 processes of the role, 8 partitions, a real cluster.
    Scale(scale::ScaleBenchArgs),
    /// Herald's relay beside Debezium's outbox router: drain rate, commit → readable, RSS and CPU.
    Peers(peers::PeersBenchArgs),
}

pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        BenchCommand::Relay(args) => relay::run(args).await,
        BenchCommand::Consume(args) => consume::run(args).await,
        BenchCommand::Rebuild(args) => rebuild::run(args).await,
        BenchCommand::Search(args) => search::run(args).await,
        BenchCommand::Status(args) => status::run(args).await,
        BenchCommand::Prune(args) => prune::run(args).await,
        BenchCommand::Latency(args) => latency::run(args).await,
        BenchCommand::Scale(args) => scale::run(args).await,
        BenchCommand::Peers(args) => peers::run(args).await,
    }
}
