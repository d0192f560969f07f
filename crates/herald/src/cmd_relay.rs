//! `herald relay`: the relay role alone. Any number of instances may run on
//! one database; they share the outbox's slices between them (see
//! `herald_relay`).

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use herald_kafka::Topics;
use herald_relay::{Relay, RelayConfig};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    #[command(flatten)]
    pub database: crate::connection::DatabaseArgs,
    #[command(flatten)]
    pub kafka: crate::connection::KafkaArgs,
    #[command(flatten)]
    pub topic: crate::topic_args::TopicArgs,
    /// Rows per batch of one slice while this relay holds all 16; a relay
    /// holding fewer reads proportionally more per slice (4 slices: 4 ×
    /// this), so it keeps about 16 × this many rows out whatever its share.
    #[arg(long, env = "HERALD_RELAY_BATCH", default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub batch_size: i64,
    /// Batches of one slice sent and not yet recorded at once: 1 waits for
    /// each batch's progress write before sending the next; 2 sends the
    /// next while the last one's acknowledgements come back (for brokers a
    /// long round trip away; after a failure the batch behind goes out
    /// again too).
    #[arg(long, env = "HERALD_RELAY_IN_FLIGHT", default_value_t = RelayConfig::default().in_flight as u64, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub in_flight: u64,
    /// Lease of a claimed slice, in milliseconds; renewed at a third of it.
    #[arg(long, env = "HERALD_RELAY_LEASE_MS", default_value_t = 15_000, value_parser = clap::value_parser!(u64).range(300..))]
    pub lease_ms: u64,
    /// Publishing attempts before a row is dead-lettered.
    #[arg(long, env = "HERALD_RELAY_MAX_ATTEMPTS", default_value_t = 10, value_parser = clap::value_parser!(i32).range(1..))]
    pub max_attempts: i32,
    /// A librdkafka setting for the relay's producers over Herald's,
    /// `KEY=VALUE`, repeatable (in the variable: separated by `;`): tuning
    /// such as `linger.ms`. Herald's delivery settings (idempotence,
    /// `acks=all`) are not meant to be changed here.
    #[arg(long = "producer", env = "HERALD_RELAY_PRODUCER", value_name = "KEY=VALUE", value_delimiter = ';', value_parser = crate::connection::parse_setting)]
    pub producer: Vec<(String, String)>,
    /// Name in claims; default host and process id.
    #[arg(long, env = "HERALD_RELAY_OWNER")]
    pub owner: Option<String>,
    #[command(flatten)]
    pub routing: crate::topic_args::RouteArgs,
}

pub async fn run(args: RelayArgs) -> anyhow::Result<ExitCode> {
    // The embedded defaults are private to one process: a relay alone on
    // them would publish nothing anyone wrote.
    let (Some(database), Some(brokers)) = (&args.database.url, &args.kafka.brokers) else {
        eprintln!(
            "error: `herald relay` needs --database (HERALD_DATABASE_URL) and --kafka (HERALD_KAFKA_BROKERS): the embedded defaults are private to one process; use `herald serve` for those"
        );
        return Ok(ExitCode::from(2));
    };
    if let Err(e) = herald_relay::check_producer_settings(&args.producer) {
        eprintln!("error: --producer: {e}");
        return Ok(ExitCode::from(2));
    }
    // Bad routing is bad input: exit 2 before anything starts.
    let routes = args.routing.routes(herald_kafka::TOPIC_EVENTS)?;
    let dataschema_base = args.routing.dataschema_base()?;
    let db = crate::connection::open_database(database, crate::connection::Schema::Check).await?;
    let kafka = args.kafka.connect_to(brokers).await?;
    // In the background and not fatal: rows for a missing topic are retried
    // and dead-lettered, never counted as delivered; and a broker that does
    // not implement CreateTopics (the mock cluster) must not delay the start.
    let (topic_kafka, settings, routed) = (kafka.clone(), args.topic.settings(), routes.clone());
    tokio::spawn(
        async move {
            if let Err(e) = crate::topic_args::ensure_routed(&topic_kafka, &Topics::default(), &routed, settings).await {
                warn!(error = %e, "could not make sure Herald's topics exist");
            }
        }
        .in_current_span(),
    );
    let faults = herald_fault::from_env()?;
    let mut config = RelayConfig {
        batch_size: args.batch_size,
        in_flight: args.in_flight as usize,
        max_attempts: args.max_attempts,
        faults,
        routes,
        dataschema_base,
        producer: args.producer,
        ..RelayConfig::default()
    }
    .with_lease(Duration::from_millis(args.lease_ms));
    if let Some(owner) = args.owner {
        config.owner = owner;
    }
    let relay = Relay::new(db, &kafka, config)?;
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(
        async move {
            crate::signals::wait_for_stop().await;
            info!("shutdown requested; draining");
            signal.cancel();
        }
        .in_current_span(),
    );
    relay.run(shutdown).await;
    Ok(ExitCode::SUCCESS)
}
