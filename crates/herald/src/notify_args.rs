//! Where the notification provider is and what it can do — configuration,
//! never discovery, and every capability defaults to the cautious answer —
//! plus the dispatcher's timings.

use std::fmt;
use std::time::Duration;

use clap::Args;
use herald_notify::dispatcher::{CALL_SLACK, DispatcherConfig};
use herald_notify::provider::{Capabilities, ProviderClient};

#[derive(Debug, Clone, Args)]
pub struct NotifyArgs {
    /// Base URL of the notification provider; default (serve): an in-process keyed simulator.
    #[arg(long, env = "HERALD_NOTIFY_URL")]
    pub notify_url: Option<String>,
    /// Whether the provider honours Idempotency-Key (same key and body → one effect). Say true only if it does.
    #[arg(long, env = "HERALD_NOTIFY_IDEMPOTENT", default_value_t = false, action = clap::ArgAction::Set)]
    pub notify_idempotent: bool,
    /// How long the provider remembers a key (e.g. 24h, 90s); declare it minus any clock skew.
    #[arg(long, env = "HERALD_NOTIFY_KEY_RETENTION", default_value = "24h", value_parser = humantime::parse_duration)]
    pub notify_key_retention: Duration,
    /// Whether the provider answers `GET /v1/notifications/{key}` (keyed providers only).
    #[arg(long, env = "HERALD_NOTIFY_QUERYABLE", default_value_t = false, action = clap::ArgAction::Set)]
    pub notify_queryable: bool,
    /// Whether a 5xx answer proves the provider did not execute the request. Say true only if it promises so.
    #[arg(long = "notify-5xx-safe", env = "HERALD_NOTIFY_5XX_SAFE", default_value_t = false, action = clap::ArgAction::Set)]
    pub notify_5xx_safe: bool,
    /// Timeout of one provider call.
    #[arg(long, env = "HERALD_NOTIFY_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub notify_timeout: Duration,
    /// Claim lease of an intent; must exceed the call timeout by 100ms.
    #[arg(long, env = "HERALD_NOTIFY_LEASE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub notify_lease: Duration,
}

/// Notification flags that contradict each other: bad input, exit 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidNotifyArgs(pub String);

impl fmt::Display for InvalidNotifyArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidNotifyArgs {}

impl NotifyArgs {
    /// What the flags declare. Retention and queries mean nothing without keys.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            honours_keys: self.notify_idempotent,
            key_retention: if self.notify_idempotent { self.notify_key_retention } else { Duration::ZERO },
            queryable: self.notify_queryable && self.notify_idempotent,
            server_errors_safe: self.notify_5xx_safe,
        }
    }

    pub fn client(&self, url: &str) -> anyhow::Result<ProviderClient> {
        Ok(ProviderClient::new(url, self.notify_timeout)?)
    }

    /// Refuses timings under which a call could outlive its claim.
    pub fn validate(&self) -> Result<(), InvalidNotifyArgs> {
        if self.notify_lease < self.notify_timeout + CALL_SLACK {
            return Err(InvalidNotifyArgs(format!(
                "--notify-lease ({:?}) must exceed --notify-timeout ({:?}) by at least {CALL_SLACK:?}: a call must never outlive its claim",
                self.notify_lease, self.notify_timeout
            )));
        }
        Ok(())
    }

    /// Client and dispatcher settings for the provider at `url` with `caps`
    /// (the flags' [`NotifyArgs::capabilities`], or what an embedded
    /// simulator is known to do).
    pub fn dispatcher(&self, url: &str, caps: Capabilities) -> anyhow::Result<(ProviderClient, DispatcherConfig)> {
        self.validate()?;
        let config = DispatcherConfig { lease: self.notify_lease, ..DispatcherConfig::new(caps) };
        Ok((self.client(url)?, config))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        notify: NotifyArgs,
    }

    fn parse(args: &[&str]) -> Result<NotifyArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("herald").chain(args.iter().copied())).map(|c| c.notify)
    }

    #[test]
    fn an_undescribed_provider_is_assumed_to_be_the_cautious_kind() -> anyhow::Result<()> {
        // The variables would override the defaults under test.
        for var in ["HERALD_NOTIFY_IDEMPOTENT", "HERALD_NOTIFY_QUERYABLE", "HERALD_NOTIFY_5XX_SAFE"] {
            anyhow::ensure!(std::env::var_os(var).is_none(), "{var} is set in the test environment");
        }
        let caps = parse(&[])?.capabilities();
        assert_eq!(caps, Capabilities { key_retention: Duration::ZERO, ..Capabilities::unkeyed() });
        let declared = parse(&["--notify-idempotent", "true", "--notify-queryable", "true", "--notify-5xx-safe", "true"])?.capabilities();
        assert!(declared.honours_keys && declared.queryable && declared.server_errors_safe);
        assert!(!parse(&["--notify-queryable", "true"])?.capabilities().queryable, "queries need keys");
        Ok(())
    }

    #[test]
    fn a_lease_that_a_call_could_outlive_is_bad_input() -> anyhow::Result<()> {
        let args = parse(&["--notify-lease", "1s", "--notify-timeout", "950ms"])?;
        let err = args.dispatcher("http://127.0.0.1:1", args.capabilities()).expect_err("lease too short");
        assert!(err.downcast_ref::<InvalidNotifyArgs>().is_some(), "{err}");
        let ok = parse(&["--notify-lease", "1200ms", "--notify-timeout", "1s"])?;
        assert!(ok.dispatcher("http://127.0.0.1:1", ok.capabilities()).is_ok());
        Ok(())
    }
}
