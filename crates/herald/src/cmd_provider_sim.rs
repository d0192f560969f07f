//! `herald provider-sim`: the reference receiver, as its own process.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use herald_proof::sim::{self, FaultSwitches, Ledger, Mode, SimConfig, Slowness};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum SimMode {
    Keyed,
    Unkeyed,
}

#[derive(Debug, Clone, Args)]
pub struct ProviderSimArgs {
    #[arg(long, value_enum, default_value = "keyed")]
    pub mode: SimMode,
    /// SQLite file of the durable ledger (created if missing).
    #[arg(long)]
    pub ledger: String,
    #[arg(long, default_value = "127.0.0.1:9700")]
    pub listen: String,
    /// How long keys are remembered (keyed mode), e.g. 24h.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub key_retention: Duration,
    /// The next N executed requests commit, then never answer (lost ACK).
    #[arg(long, default_value_t = 0)]
    pub drop_responses: u32,
    /// The next executed request commits, then the process exits.
    #[arg(long)]
    pub exit_after_commit: bool,
    /// Hold requests until `POST /faults {"pause": false}`.
    #[arg(long)]
    pub pause: bool,
    /// Be a slow provider for callers with this call timeout: answer close
    /// to it, sometimes after it, and sometimes execute then drop the
    /// connection (GET /effects/ambiguous counts those calls).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub slow_around: Option<Duration>,
}

pub async fn run(args: ProviderSimArgs) -> anyhow::Result<ExitCode> {
    let ledger = Ledger::open(&args.ledger).await?;
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    println!("provider-sim listening on http://{}", listener.local_addr()?);
    let mode = match args.mode {
        SimMode::Keyed => Mode::Keyed,
        SimMode::Unkeyed => Mode::Unkeyed,
    };
    let faults = FaultSwitches {
        drop_responses: args.drop_responses,
        exit_after_commit: args.exit_after_commit,
        pause: args.pause,
        refuse_for_ms: 0,
    };
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(
        async move {
            crate::signals::wait_for_stop().await;
            signal.cancel();
        }
        .in_current_span(),
    );
    let slow = args.slow_around.map(|call_timeout| Slowness { call_timeout });
    sim::serve(listener, ledger, SimConfig { mode, key_retention: args.key_retention, slow }, faults, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}
