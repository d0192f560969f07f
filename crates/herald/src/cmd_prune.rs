//! `herald prune`: delivered outbox rows, inbox rows, settled intents,
//! settled dead letters, search tombstones and intake keys older than a
//! retention go, in small batches (see herald-wiring's `prune`).
//!
//! Each of those rows can still matter while a record of its event can be
//! delivered again (the inbox row and the intent's key recognise it, a
//! tombstone outvotes it): a retention shorter than the events topic's
//! retention (read from the broker) plus a redrive window is refused with
//! exit 2 unless `--force`. The audit and rebuilds read the horizon the
//! prune records and check only above it.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use herald_kafka::Topics;
use herald_store::prune::Kind;
use herald_wiring::prune::{self, PruneOptions, Pruned};
use herald_wiring::retention::{self, TopicRetention};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

const DAY: Duration = Duration::from_secs(86_400);

#[derive(Debug, Clone, Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub database: crate::connection::DatabaseArgs,
    /// The cluster whose events topic's retention sets the floor.
    #[command(flatten)]
    pub kafka: crate::connection::KafkaArgs,
    /// Age in days past which rows go; at least the events topic's retention
    /// (read from the broker) plus --redrive-window-days.
    #[arg(long)]
    pub older_than_days: u32,
    #[command(flatten)]
    pub pace: PrunePace,
    /// Prefix of Herald's topic names, as the subscriptions run with it.
    #[arg(long, env = "HERALD_TOPIC_PREFIX")]
    pub topic_prefix: Option<String>,
    /// Only these kinds (comma-separated): outbox, inbox, intents,
    /// dead_letters, tombstones, intake_keys. Default: all.
    #[arg(long, value_delimiter = ',', value_parser = parse_kind)]
    pub only: Vec<Kind>,
    /// Remove rows even below the floor: a record delivered again after its
    /// rows are gone can have a second effect, or bring a deleted document back.
    #[arg(long)]
    pub force: bool,
}

/// How a prune goes about it, here and on `serve`'s schedule.
#[derive(Debug, Clone, Args)]
pub struct PrunePace {
    /// How long after the broker dropped a record a redrive may still
    /// deliver it again.
    #[arg(long, env = "HERALD_REDRIVE_WINDOW_DAYS", default_value_t = retention::DEFAULT_REDRIVE_WINDOW_DAYS)]
    pub redrive_window_days: u32,
    /// Rows per batch; each batch is its own short transaction.
    #[arg(long, env = "HERALD_PRUNE_BATCH", default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub prune_batch: i64,
    /// Time resting per unit of time deleting, between batches.
    #[arg(long, env = "HERALD_PRUNE_IDLE_RATIO", default_value_t = 2.0, value_parser = parse_idle_ratio)]
    pub prune_idle_ratio: f64,
}

impl PrunePace {
    pub fn options(&self, older_than_days: u32, kinds: Vec<Kind>) -> PruneOptions {
        PruneOptions {
            retention: DAY * older_than_days,
            kinds: if kinds.is_empty() { Kind::ALL.to_vec() } else { kinds },
            batch: self.prune_batch,
            idle_ratio: self.prune_idle_ratio,
            inbox_of: None,
        }
    }

    /// `Err(message)` when the retention is below the floor for `topic`.
    pub async fn check_floor(&self, kafka: Option<&herald_kafka::KafkaConfig>, topic: &str, older_than_days: u32) -> Result<(), String> {
        let kept = TopicRetention::read(kafka, topic).await;
        let what = "rows a redelivery could still need (inbox rows, intents, tombstones)";
        retention::check(what, DAY * older_than_days, topic, &kept, DAY * self.redrive_window_days).map_err(|r| r.0)
    }
}

/// `serve`'s prune schedule: off unless a retention is given.
#[derive(Debug, Clone, Args)]
pub struct ServePrune {
    /// Prune every --prune-every-minutes rows older than this many days
    /// (see `herald prune`); the floor is checked at start (exit 2 below it).
    #[arg(long, env = "HERALD_PRUNE_OLDER_THAN_DAYS")]
    pub prune_older_than_days: Option<u32>,
    #[arg(long, env = "HERALD_PRUNE_EVERY_MINUTES", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub prune_every_minutes: u64,
    #[command(flatten)]
    pub pace: PrunePace,
}

impl ServePrune {
    /// The schedule for `wiring`, or the refusal to print (exit 2).
    pub async fn schedule(&self, wiring: &herald_wiring::pipeline::Wiring) -> Result<Option<herald_wiring::prune::Schedule>, String> {
        let Some(days) = self.prune_older_than_days else { return Ok(None) };
        self.pace.check_floor(Some(&wiring.kafka), &wiring.topics.events, days).await?;
        let every = Duration::from_secs(self.prune_every_minutes * 60);
        Ok(Some(herald_wiring::prune::Schedule { options: self.pace.options(days, Vec::new()), every }))
    }
}

fn parse_idle_ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 0.0 => Ok(r),
        _ => Err(format!("{text:?} is not a number ≥ 0")),
    }
}

fn parse_kind(text: &str) -> Result<Kind, String> {
    Kind::parse(text).ok_or_else(|| {
        let known: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
        format!("unknown kind {text:?}; one of {}", known.join(", "))
    })
}

pub async fn run(args: PruneArgs) -> anyhow::Result<ExitCode> {
    if !args.force {
        let topic = args.topic_prefix.as_deref().map_or_else(Topics::default, Topics::with_prefix).events;
        let kafka = args.kafka.connect().await?;
        if let Err(refusal) = args.pace.check_floor(kafka.as_ref(), &topic, args.older_than_days).await {
            eprintln!("error: {refusal}");
            return Ok(ExitCode::from(2));
        }
    }
    let db = args.database.open("herald prune", herald_wiring::connection::Schema::Check).await?;
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    let stop = tokio::spawn(
        async move {
            crate::signals::wait_for_stop().await;
            signal.cancel();
        }
        .in_current_span(),
    );
    let pruned = prune::prune(&db, &args.pace.options(args.older_than_days, args.only), &shutdown).await?;
    stop.abort();
    print!("{}", render(&pruned));
    Ok(if pruned.interrupted { ExitCode::from(130) } else { ExitCode::SUCCESS })
}

fn render(pruned: &Pruned) -> String {
    let horizon =
        chrono::DateTime::from_timestamp_millis(pruned.horizon_ms).map_or_else(|| pruned.horizon_ms.to_string(), |t| t.to_rfc3339());
    let mut out = format!("horizon {horizon}: rows dated before it may now be gone\n");
    for (kind, removed) in &pruned.removed {
        out.push_str(&format!("  {:<13} {removed:>10} removed ({})\n", kind.as_str(), kind.describe()));
    }
    if pruned.interrupted {
        out.push_str("interrupted: run again to finish (the horizons already cover what was removed)\n");
    }
    out
}
