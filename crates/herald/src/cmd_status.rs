//! `herald status [--json]`: the figures of a running deployment, once —
//! the same collector `/metrics` and `/status` refresh. With `--kafka` they
//! include each topic's durability (`kafka.topics` in JSON, `TOPICS` in the
//! table): a topic whose settings can lose acknowledged events is flagged
//! with the reason, but the command still succeeds — it reports, it does not
//! gate.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use herald_kafka::Topics;
use herald_status::KafkaProbe;

use crate::subscriptions::Name;

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub database: crate::connection::DatabaseArgs,
    /// Without `--kafka`, lag and the topics' durability (replication,
    /// settings, what can lose acknowledged events) are not measured (and
    /// said so).
    #[command(flatten)]
    pub kafka: crate::connection::KafkaArgs,
    /// Prefix of Herald's topic names, as the deployment uses it.
    #[arg(long, env = "HERALD_TOPIC_PREFIX")]
    pub topic_prefix: Option<String>,
    /// Prefix of consumer group ids (`<prefix>.<subscription>`).
    #[arg(long, env = "HERALD_GROUP_PREFIX", default_value = "herald")]
    pub group_prefix: String,
    /// How long to wait for each broker answer.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub kafka_timeout: Duration,
    /// One JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let Some(url) = &args.database.url else {
        eprintln!("error: `herald status` needs --database (or HERALD_DATABASE_URL)");
        return Ok(ExitCode::from(2));
    };
    // Check only: a status look must not migrate a database it was pointed at.
    let db = crate::connection::open_database(url, crate::connection::Schema::Check).await?;
    let names: Vec<&str> = Name::ALL.iter().map(|n| n.as_str()).collect();
    let probe = match &args.kafka.brokers {
        Some(brokers) => {
            let kafka = args.kafka.config_for(brokers)?;
            crate::connection::check(&kafka, args.kafka_timeout).await?;
            let topics = args.topic_prefix.as_deref().map_or_else(Topics::default, Topics::with_prefix);
            Some(KafkaProbe::new(&kafka, &topics, &args.group_prefix, &names, args.kafka_timeout)?)
        }
        None => None,
    };
    let status = herald_status::collect(&db, probe.as_ref(), &names).await?;
    if args.json {
        println!("{}", serde_json::to_string(&status)?);
    } else {
        print!("{}", herald_status::text::render(&status));
    }
    Ok(ExitCode::SUCCESS)
}
