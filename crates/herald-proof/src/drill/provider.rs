//! The adversarial side of the drill: which provider the dispatchers face
//! (`--provider`), what it and the intents show after the drain, and the
//! mode's targets.
//!
//! A slow provider answers close to the call timeout, sometimes after it,
//! and sometimes executes and then drops the connection; the simulator
//! counts those ambiguous calls (and any request it died in before
//! answering). Dispatchers are SIGKILLed too: each kill may interrupt the one
//! call its dispatcher had in flight. So is the simulator: a request it died
//! on before recording it leaves no trace there, only an `unknown` intent
//! whose key it never saw.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::ValueEnum;
use herald_notify::provider::NO_ANSWER;
use herald_notify::rules::{EARLIER_ATTEMPT, UNKNOWN};
use herald_status::counts;
use herald_store::Db;
use serde::Serialize;

use crate::sim::{KeyRequests, Totals};

/// Dispatchers running side by side: their claims keep them apart.
pub const DISPATCHERS: usize = 3;
/// Timeout of one provider call; the slow provider's delays are measured
/// against it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// Claim lease: a batch reaches its last intent within it (see
/// `herald_notify::dispatcher::batch_limit`).
pub const LEASE: Duration = Duration::from_secs(4);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderMode {
    /// Honours Idempotency-Key; answers at once.
    Keyed,
    /// Executes every request; answers at once.
    Unkeyed,
    /// Honours keys; answers around the call timeout, sometimes drops the connection.
    SlowKeyed,
    /// Executes every request; answers around the call timeout, sometimes drops the connection.
    SlowUnkeyed,
}

impl ProviderMode {
    pub fn keyed(self) -> bool {
        matches!(self, ProviderMode::Keyed | ProviderMode::SlowKeyed)
    }

    pub fn slow(self) -> bool {
        matches!(self, ProviderMode::SlowKeyed | ProviderMode::SlowUnkeyed)
    }

    /// `herald provider-sim` flags (after `--mode`).
    pub fn sim_args(self) -> Vec<String> {
        let mut args = vec!["--mode".to_owned(), if self.keyed() { "keyed" } else { "unkeyed" }.to_owned()];
        if self.slow() {
            args.extend(["--slow-around".to_owned(), humantime::format_duration(CALL_TIMEOUT).to_string()]);
        }
        args
    }

    /// The dispatcher's declared capabilities: what the provider really
    /// does, never more.
    pub fn dispatch_args(self, url: &str) -> Vec<String> {
        let keyed = if self.keyed() { "true" } else { "false" };
        let duration = |d: Duration| humantime::format_duration(d).to_string();
        ["dispatch", "--notify-url", url, "--notify-idempotent", keyed, "--notify-queryable", keyed]
            .into_iter()
            .map(str::to_owned)
            .chain(["--notify-timeout".to_owned(), duration(CALL_TIMEOUT), "--notify-lease".to_owned(), duration(LEASE)])
            .collect()
    }
}

/// What the provider saw.
#[derive(Debug, Clone, Serialize)]
pub struct ProviderReport {
    pub mode: ProviderMode,
    pub requests: i64,
    pub effects: i64,
    /// Effects beyond the first per key.
    pub duplicates: i64,
    /// Calls whose answer may not have reached the dispatcher.
    pub ambiguous_calls: i64,
    pub ambiguous_by_kind: BTreeMap<String, i64>,
}

/// Asks the simulator at `url` for its totals.
pub async fn provider_report(url: &str, mode: ProviderMode, duplicates: i64) -> anyhow::Result<ProviderReport> {
    let totals: Totals = reqwest::get(format!("{url}/effects")).await?.error_for_status()?.json().await?;
    let kinds = reqwest::get(format!("{url}/effects/ambiguous")).await?.error_for_status()?.json().await?;
    Ok(ProviderReport {
        mode,
        requests: totals.requests,
        effects: totals.effects,
        duplicates,
        ambiguous_calls: totals.ambiguous,
        ambiguous_by_kind: kinds,
    })
}

/// Where the intents ended.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IntentReport {
    pub total: i64,
    pub by_status: BTreeMap<String, i64>,
    /// `unknown` intents whose reason blames an earlier, interrupted call.
    pub unknown_interrupted: i64,
    /// `unknown` intents after a call that got no answer, under a key the
    /// provider recorded.
    pub unknown_unanswered: i64,
    /// `unknown` intents after a call that got no answer, under a key the
    /// provider never recorded: it died before it recorded the request.
    pub unknown_unseen: i64,
    /// A few reasons, for the reader.
    pub unknown_reasons: BTreeMap<String, i64>,
}

impl IntentReport {
    pub fn unknown(&self) -> i64 {
        self.unknown_interrupted + self.unknown_unanswered + self.unknown_unseen
    }
}

/// Where the intents ended; the simulator at `sim_url` is asked, for each
/// `unknown` intent after an unanswered call, whether it saw its key.
pub async fn intent_report(db: &Db, sim_url: &str) -> anyhow::Result<IntentReport> {
    let by_status = counts::collect(db).await?.intents;
    let mut report = IntentReport { total: by_status.total(), by_status: by_status.0, ..IntentReport::default() };
    let client = reqwest::Client::new();
    for intent in counts::intents_in(db, UNKNOWN).await? {
        let reason = intent.last_error.unwrap_or_default();
        if reason.starts_with(EARLIER_ATTEMPT) {
            report.unknown_interrupted += 1;
        } else if key_requests(&client, sim_url, &intent.idempotency_key).await?.requests == 0 {
            report.unknown_unseen += 1;
        } else {
            report.unknown_unanswered += 1;
        }
        *report.unknown_reasons.entry(reason_class(&reason)).or_default() += 1;
    }
    Ok(report)
}

async fn key_requests(client: &reqwest::Client, sim_url: &str, key: &str) -> anyhow::Result<KeyRequests> {
    let mut url = reqwest::Url::parse(sim_url)?;
    url.path_segments_mut().map_err(|()| anyhow::anyhow!("{sim_url} cannot take a path"))?.push("requests").push(key);
    Ok(client.get(url).send().await?.error_for_status()?.json().await?)
}

/// A reason without its particulars (URLs, error chains), to group by.
fn reason_class(reason: &str) -> String {
    let (head, tail) = reason.split_once("; ").unwrap_or((reason, ""));
    let head = match head {
        _ if head.starts_with(&format!("{NO_ANSWER} within")) => "no answer within the call timeout",
        _ if head.starts_with(NO_ANSWER) => "no answer: the connection ended",
        _ => head,
    };
    if tail.is_empty() { head.to_owned() } else { format!("{head}; {tail}") }
}

/// One target of the mode, met or not.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub name: &'static str,
    pub met: bool,
    pub detail: String,
}

/// Processes that died during the run (SIGKILLed or exited on their own).
#[derive(Debug, Clone, Copy, Default)]
pub struct Deaths {
    /// Each could interrupt the one call its dispatcher had in flight.
    pub dispatchers: u64,
    /// Each could take with it one unrecorded request per dispatcher.
    pub providers: u64,
}

/// The mode's targets.
pub fn targets(provider: &ProviderReport, intents: &IntentReport, deaths: Deaths) -> Vec<Target> {
    let mut targets = vec![Target {
        name: "no duplicate effect",
        met: provider.duplicates == 0,
        detail: format!("{} effects beyond the first per key", provider.duplicates),
    }];
    if provider.mode.slow() {
        targets.push(Target {
            name: "the provider was ambiguous",
            met: provider.ambiguous_calls > 0,
            detail: format!("{} ambiguous calls; a slow run without any proves nothing", provider.ambiguous_calls),
        });
    }
    if provider.mode.keyed() {
        targets.push(Target {
            name: "no unknown after the drain",
            met: intents.unknown() == 0,
            detail: format!("{} unknown", intents.unknown()),
        });
        return targets;
    }
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let unseen_bound = count(deaths.providers).saturating_mul(i64::try_from(DISPATCHERS).unwrap_or(i64::MAX));
    targets.push(Target {
        name: "unknown only after an ambiguous call",
        met: intents.unknown_unanswered <= provider.ambiguous_calls,
        detail: format!(
            "{} unknown after an unanswered call, {} ambiguous calls at the provider",
            intents.unknown_unanswered, provider.ambiguous_calls
        ),
    });
    targets.push(Target {
        name: "unknown only after an interrupted call",
        met: intents.unknown_interrupted <= count(deaths.dispatchers),
        detail: format!(
            "{} unknown after an interrupted call, {} dispatcher deaths (one call in flight each at most)",
            intents.unknown_interrupted, deaths.dispatchers
        ),
    });
    targets.push(Target {
        name: "unknown only after a call the provider never saw because it died",
        met: intents.unknown_unseen <= unseen_bound,
        detail: format!(
            "{} unknown under a key the provider never recorded, {} provider deaths × {DISPATCHERS} dispatchers (one call in flight each at most)",
            intents.unknown_unseen, deaths.providers
        ),
    });
    targets
}

#[cfg(test)]
mod tests;
