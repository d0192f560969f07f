//! `herald audit`: every invariant checked against the database, the Kafka
//! history, the artifact store and the notification provider. Exit 0 clean,
//! 1 with violations (each named), 2 when the audit could not run.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use herald_audit::Sources;
use herald_export::artifact::ArtifactStore;
use herald_kafka::Topics;
use herald_store::Db;

use crate::config::Backends;

#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pub backends: Backends,
    /// The notification provider (e.g. `herald provider-sim`) whose effects
    /// must equal the sent intents; without it that check is skipped.
    #[arg(long, env = "HERALD_NOTIFY_URL")]
    pub notify_url: Option<String>,
    /// How long reading the Kafka history may take.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub kafka_timeout: Duration,
    /// How far the clocks of the hosts that wrote the rows may disagree;
    /// facts this close above a prune horizon are not checked.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    pub clock_skew: Duration,
    /// Violations listed per check in the table (all are counted).
    #[arg(long, default_value_t = 20)]
    pub show: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: AuditArgs) -> anyhow::Result<ExitCode> {
    let (Some(database), Some(brokers)) = (&args.backends.database.url, &args.backends.kafka.brokers) else {
        eprintln!(
            "error: herald audit needs --database (HERALD_DATABASE_URL) and --kafka (HERALD_KAFKA_BROKERS): it checks what they hold"
        );
        return Ok(ExitCode::from(2));
    };
    let artifacts = match args.backends.artifacts.as_deref().map(ArtifactStore::from_location).transpose() {
        Ok(store) => store,
        Err(e) => {
            eprintln!("error: --artifacts: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    // Check without migrating: an audit writes nothing, and reads what this
    // release knows.
    let db = match Db::connect_checked(database.expose()).await {
        Ok(db) => db,
        Err(e) => {
            eprintln!("error: cannot audit: database {database}: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let kafka = args.backends.kafka.connect_to(brokers).await?;
    let topics = args.backends.topic_prefix.as_deref().map_or_else(Topics::default, Topics::with_prefix);
    let sources = Sources {
        db: &db,
        kafka: &kafka,
        topics: &topics,
        artifacts,
        provider_url: args.notify_url.clone(),
        kafka_timeout: args.kafka_timeout,
        clock_skew: args.clock_skew,
    };
    let report = match herald_audit::audit(&sources).await {
        Ok((report, _)) => report,
        Err(e) => {
            eprintln!("error: cannot audit: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("herald audit — {database}, {brokers}\n");
        print!("{}", report.table(args.show));
    }
    Ok(if report.ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
