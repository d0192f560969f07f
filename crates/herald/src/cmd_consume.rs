//! `herald consume <subscription>`: one subscription alone in this process.
//! Several processes of the same subscription form one consumer group and
//! share its partitions; each process prints a one-line JSON summary of what
//! it did when it stops (SIGINT/SIGTERM).

use std::process::ExitCode;

use clap::Args;
use herald_consumer::{Metrics, Order, SubscriptionOptions};
use herald_fault::Spec;
use herald_kafka::{KafkaConfig, Topics};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

use crate::config::Backends;
use crate::subscriptions::{self, Name};

#[derive(Debug, Clone, Args)]
pub struct ConsumeArgs {
    /// The subscription to run.
    #[arg(value_enum)]
    pub subscription: Name,
    #[command(flatten)]
    pub backends: Backends,
    /// Most records applied in one transaction.
    #[arg(long, env = "HERALD_MAX_BATCH", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_batch: u32,
    /// notify only: where to start when the group has no committed offset and
    /// the topic holds history — `latest` or an RFC 3339 time. Without it,
    /// such a start is refused (exit 2) rather than notifying old events.
    #[arg(long, value_parser = herald_notify::start::parse_start_at)]
    pub start_at: Option<herald_notify::start::StartAt>,
    /// After a record is dead-lettered, what becomes of its key's later
    /// records: `per-key` parks them behind it, in order, until it is
    /// redriven or discarded (`herald dlq`); `none` applies them as they
    /// come. Default: what the subscription's handler declares (`none` for
    /// search, stats and notify, which do not depend on a key's order).
    #[arg(long)]
    pub order: Option<Order>,
    /// Fault injection for crash tests (`herald_fault::Spec`): e.g.
    /// `pause-after-commit:N` stops forever after the N-th batch committed
    /// and before its offsets are stored.
    #[arg(long, env = "HERALD_FAULT", hide = true, value_parser = Spec::parse)]
    pub fault: Option<Spec>,
}

pub async fn run(args: ConsumeArgs) -> anyhow::Result<ExitCode> {
    // Keeps the embedded broker and data directory alive, when used.
    let mut _embedded = None;
    let (db, kafka, topics) = match &args.backends.kafka.brokers {
        None => {
            // Embedded broker: no other process can reach it; a toy run.
            let env = args.backends.resolve().await?;
            let wiring = env.wiring.clone();
            _embedded = Some(env);
            (wiring.db, wiring.kafka, wiring.topics)
        }
        Some(brokers) => {
            let Some(url) = &args.backends.database.url else {
                eprintln!("error: --database (or HERALD_DATABASE_URL) is needed with --kafka");
                return Ok(ExitCode::from(2));
            };
            let db = crate::connection::open_database(url, crate::connection::Schema::Check).await?;
            let topics = args.backends.topic_prefix.as_deref().map_or_else(Topics::default, Topics::with_prefix);
            let kafka = args.backends.kafka.connect_to(brokers).await?;
            ensure_topics(&kafka, &topics, args.backends.topic.settings()).await;
            (db, kafka, topics)
        }
    };
    let notify = args.backends.notify_handler()?;
    let options = SubscriptionOptions {
        max_batch: args.max_batch as usize,
        order: args.order,
        faults: args.fault.clone().map(Spec::hook).unwrap_or_default(),
        registry: args.backends.registry()?,
        ..SubscriptionOptions::default()
    };
    let sub = args.subscription.subscription(&args.backends.group_prefix, &kafka, &topics.events);
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(
        async move {
            crate::signals::wait_for_stop().await;
            info!("shutdown requested; finishing the batch in flight");
            signal.cancel();
        }
        .in_current_span(),
    );
    let metrics = Metrics::default();
    if args.start_at.is_some() && args.subscription != Name::Notify {
        eprintln!("error: --start-at applies to the notify subscription only");
        return Ok(ExitCode::from(2));
    }
    let s = match subscriptions::run_from(args.subscription, &db, &sub, &options, &metrics, args.start_at, &notify, shutdown).await {
        Ok(s) => s,
        Err(e) => match e.downcast_ref::<herald_notify::start::Refused>() {
            Some(refused) => {
                eprintln!("error: {refused}");
                return Ok(ExitCode::from(2));
            }
            None => return Err(e),
        },
    };
    println!(
        "{}",
        json!({"subscription": sub.name, "group": sub.group, "applied": s.applied, "duplicates": s.duplicates,
            "skipped": s.skipped, "dead_lettered": s.dead_lettered, "parked": s.parked, "batches": s.batches, "retries": s.retries})
    );
    Ok(ExitCode::SUCCESS)
}

/// Creates the topics when missing (`ensure_topics` asks nothing of a
/// broker that lists them already, so the mock cluster of a test process,
/// which has no CreateTopics, is fine once they exist).
async fn ensure_topics(kafka: &KafkaConfig, topics: &Topics, settings: herald_kafka::TopicSettings) {
    if let Err(e) = herald_kafka::ensure_topics(kafka, &topics.all(), settings).await {
        warn!(error = %e, "could not create topics; subscribing anyway");
    }
}
