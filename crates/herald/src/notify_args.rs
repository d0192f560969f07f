//! Where the notification provider is and what it can do — configuration,
//! never discovery — plus the dispatcher's timings and its crash-drill hook.

use std::time::Duration;

use clap::Args;
use herald_notify::dispatcher::{AfterResponseHook, DispatcherConfig};
use herald_notify::provider::{Capabilities, ProviderClient};

#[derive(Debug, Clone, Args)]
pub struct NotifyArgs {
    /// Base URL of the notification provider; default (serve): an in-process keyed simulator.
    #[arg(long, env = "HERALD_NOTIFY_URL")]
    pub notify_url: Option<String>,
    /// Whether the provider honours Idempotency-Key. Say false unless it does.
    #[arg(long, env = "HERALD_NOTIFY_IDEMPOTENT", default_value_t = true, action = clap::ArgAction::Set)]
    pub notify_idempotent: bool,
    /// How long the provider remembers a key (e.g. 24h, 90s).
    #[arg(long, env = "HERALD_NOTIFY_KEY_RETENTION", default_value = "24h", value_parser = humantime::parse_duration)]
    pub notify_key_retention: Duration,
    /// Whether the provider answers `GET /v1/notifications/{key}`.
    #[arg(long, env = "HERALD_NOTIFY_QUERYABLE", default_value_t = true, action = clap::ArgAction::Set)]
    pub notify_queryable: bool,
    /// Timeout of one provider call.
    #[arg(long, env = "HERALD_NOTIFY_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub notify_timeout: Duration,
    /// Claim lease of an intent; must exceed the call timeout.
    #[arg(long, env = "HERALD_NOTIFY_LEASE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub notify_lease: Duration,
}

impl NotifyArgs {
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            honours_keys: self.notify_idempotent,
            key_retention: if self.notify_idempotent { self.notify_key_retention } else { Duration::ZERO },
            queryable: self.notify_queryable && self.notify_idempotent,
        }
    }

    /// Client and dispatcher settings for the provider at `url`.
    pub fn dispatcher(&self, url: &str) -> anyhow::Result<(ProviderClient, DispatcherConfig)> {
        anyhow::ensure!(
            self.notify_lease > self.notify_timeout,
            "--notify-lease ({:?}) must exceed --notify-timeout ({:?}): a call must never outlive its claim",
            self.notify_lease,
            self.notify_timeout
        );
        let client = ProviderClient::new(url, self.notify_timeout)?;
        let config = DispatcherConfig { lease: self.notify_lease, ..DispatcherConfig::new(self.capabilities()) };
        Ok((client, config))
    }
}

/// `HERALD_FAULT=hang:after-provider-response`: after the provider answered,
/// print `herald-fault: hang at after-provider-response key=<key>` and stop
/// there forever, so a drill can SIGKILL the dispatcher inside the window
/// where the receipt is not yet recorded. For drills and tests only.
pub fn hook_from_env() -> AfterResponseHook {
    match std::env::var("HERALD_FAULT").as_deref() {
        Ok("hang:after-provider-response") => AfterResponseHook::new(|key| async move {
            println!("herald-fault: hang at after-provider-response key={key}");
            use std::io::Write;
            let _ = std::io::stdout().flush();
            std::future::pending::<()>().await;
        }),
        _ => AfterResponseHook::default(),
    }
}
