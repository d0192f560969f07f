//! The reference receiver inside the `herald` process: what `herald serve`
//! dispatches to when no `--notify-url` is given, and what `herald demo`
//! checks its notifications against.

use std::time::Duration;

use anyhow::Context;
use herald_notify::provider::Capabilities;
use herald_wiring::config::Environment;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info};

use crate::sim::{self, FaultSwitches, Ledger, SimConfig};

/// The in-process reference receiver and what it is known to do.
#[derive(Debug, Clone)]
pub struct EmbeddedProvider {
    pub url: String,
    pub caps: Capabilities,
}

/// How long the embedded simulator remembers keys.
const KEY_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Starts the reference receiver in this process, keyed, with its ledger
/// in `env`'s data directory. Its capabilities are set here, not taken from
/// flags: Herald knows exactly what this receiver does.
pub async fn start_provider(env: &Environment, faults: FaultSwitches) -> anyhow::Result<EmbeddedProvider> {
    let dir = env.data_dir().context("no data directory")?;
    let ledger = Ledger::open(&dir.join("provider-ledger.sqlite").display().to_string()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let config = SimConfig::keyed(KEY_RETENTION);
    tokio::spawn(sim::serve(listener, ledger, config, faults, CancellationToken::new()).in_current_span());
    // Keyed and queryable, as the simulator is; 5xx stay "may have executed".
    let caps = Capabilities::keyed(KEY_RETENTION);
    info!(%url, honours_keys = caps.honours_keys, queryable = caps.queryable, "embedded keyed provider simulator; its capabilities replace the --notify-* flags");
    Ok(EmbeddedProvider { url, caps })
}
