//! `order-totals`: the example read model as a process of its own, run next
//! to Herald's roles on the same database and cluster.
//!
//! ```sh
//! herald migrate --database "$DB"                       # Herald's schema, once
//! order-totals live --database "$DB" --kafka "$BROKERS" --topic orders
//! order-totals rebuild --database "$DB" --kafka "$BROKERS" --topic orders
//! order-totals show --database "$DB" CUSTOMER
//! ```

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use herald_consumer::{Live, Metrics, Projection, Subscription, SubscriptionOptions};
use herald_envelope::{Registry, Sources};
use herald_kafka::KafkaConfig;
use herald_rebuild::replay::ReplayProgress;
use herald_rebuild::{Progress, RebuildOptions};
use herald_store::Db;
use order_totals::{OrderTotals, SOURCE};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(about = "Order totals per customer, a read model on Herald's projection engine")]
struct Cli {
    /// Herald's database (`herald migrate` has run on it).
    #[arg(long, env = "HERALD_DATABASE_URL", global = true)]
    database: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Applies the topic's events as they arrive, until Ctrl-C.
    Live {
        #[arg(long, env = "HERALD_KAFKA_BROKERS")]
        kafka: String,
        #[arg(long)]
        topic: String,
        /// Consumer group prefix: the group is `<prefix>.order_totals`.
        #[arg(long, default_value = "herald")]
        group_prefix: String,
    },
    /// Replays the topic into a new generation, verifies it against the
    /// live one and switches reads to it.
    Rebuild {
        #[arg(long, env = "HERALD_KAFKA_BROKERS")]
        kafka: String,
        #[arg(long)]
        topic: String,
    },
    /// Prints a customer's orders and net cents.
    Show { customer: String },
}

struct Printed;

impl Progress for Printed {
    fn phase(&mut self, phase: &str) {
        eprintln!("order-totals: {phase}");
    }
    fn replayed(&mut self, _: ReplayProgress) {}
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let cli = Cli::parse();
    let Some(url) = cli.database else {
        eprintln!("error: --database (HERALD_DATABASE_URL) is required");
        return Ok(ExitCode::from(2));
    };
    let db = Db::connect_checked(&url).await?;
    order_totals::install(&db).await?;
    // The shop's events, not only Herald's own source, live and replayed.
    let registry = Registry::embedded().accepting(Sources::new([SOURCE.to_owned()])?);
    match cli.command {
        Command::Live { kafka, topic, group_prefix } => {
            let kafka = KafkaConfig::new(kafka);
            let subscription = Subscription::new(OrderTotals::NAME, &group_prefix, &kafka, &[topic.as_str()]);
            let options = SubscriptionOptions { registry, ..SubscriptionOptions::default() };
            let stop = CancellationToken::new();
            let signal = stop.clone();
            tokio::spawn(async move {
                let _ = tokio::signal::ctrl_c().await;
                signal.cancel();
            });
            herald_consumer::run_subscription(&subscription, &db, &Live::new(OrderTotals, &topic), &options, &Metrics::default(), stop)
                .await?;
        }
        Command::Rebuild { kafka, topic } => {
            let options = RebuildOptions { kafka: KafkaConfig::new(kafka), topic, registry, ..RebuildOptions::default() };
            let report = herald_rebuild::rebuild::rebuild(&db, &OrderTotals, &options, &mut Printed, &CancellationToken::new()).await?;
            println!("generation {} {} (replayed {}, switched {})", report.generation, report.state, report.replayed, report.switched);
        }
        Command::Show { customer } => match order_totals::totals_of(&db, &customer).await? {
            Some((orders, net_cents)) => println!("{customer}: {orders} orders, {net_cents} cents"),
            None => println!("{customer}: no orders"),
        },
    }
    Ok(ExitCode::SUCCESS)
}
