//! `herald`: one binary, one subcommand per job.

use herald::config_file::{self, ConfigFile, Resolved};
use herald::lifecycle_args::LifecycleArgs;
use herald::notify_args::{InvalidNotifyArgs, NotifyArgs};
use herald::pipeline::Roles;
use herald::{
    bench, cmd_audit, cmd_config, cmd_consume, cmd_dlq, cmd_inbox, cmd_notify, cmd_outbox, cmd_provider_sim, cmd_prune, cmd_rebuild,
    cmd_relay, cmd_status, config, pipeline,
};
use herald_notify::start::{self as notify_start, StartAt};
use herald_proof::{demo, drill};

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info};

use config::Backends;

/// jemalloc, not glibc's malloc, for Rust's allocations and for the C
/// libraries' too (librdkafka, linked in: the workspace enables jemalloc's
/// unprefixed `malloc`). With glibc's, a draining relay spent about a
/// quarter of its CPU allocating and freeing Rust's row strings and futures
/// and librdkafka's messages and headers, much of it consolidating fast
/// bins and freeing on one thread what another allocated; with everything
/// in jemalloc it drains ~30 % faster than with jemalloc for Rust alone
/// (BENCHMARKS.md, "One allocator for the whole binary" and "librdkafka's
/// allocations too"). Its built-in defaults (freed pages given back after
/// 1 s) are in `.cargo/config.toml`; `MALLOC_CONF` overrides them at run
/// time.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Debug, Parser)]
#[command(name = "herald", version, about = "Business facts from a database to Kafka, and read models you can rebuild")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines on stderr: `text` for people, `json` (one object per line,
    /// with the current span, its parents, and the trace and span ids) for log collectors.
    #[arg(long, global = true, env = "HERALD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// A `herald.toml` holding settings for every command (flag > environment > file > default).
    #[arg(long, global = true, env = config_file::CONFIG_ENV)]
    config: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the whole pipeline once on the embedded default and check it.
    Demo(demo::DemoArgs),
    /// Run every role (API, relay, worker, search/stats/notify subscriptions) in one process.
    Serve {
        #[command(flatten)]
        backends: Backends,
        /// Address of the HTTP API.
        #[arg(long, env = "HERALD_LISTEN", default_value = "127.0.0.1:8080")]
        listen: String,
        #[command(flatten)]
        lifecycle: LifecycleArgs,
        #[command(flatten)]
        notify: NotifyArgs,
        /// Where the notify subscription starts when its group has no committed
        /// offset and the events topic holds history: `latest` or an RFC 3339
        /// time. Without it such a start is refused (exit 2).
        #[arg(long, env = "HERALD_NOTIFY_START_AT", value_parser = notify_start::parse_start_at)]
        notify_start_at: Option<StartAt>,
        #[command(flatten)]
        prune: cmd_prune::ServePrune,
        #[command(flatten)]
        routing: Box<herald::topic_args::RouteArgs>,
    },
    /// Run the HTTP API alone (intake, job reads, search).
    Api {
        #[command(flatten)]
        backends: Backends,
        /// Address of the HTTP API.
        #[arg(long, env = "HERALD_LISTEN", default_value = "127.0.0.1:8080")]
        listen: String,
        #[command(flatten)]
        lifecycle: LifecycleArgs,
    },
    /// Run export workers alone: attempts, the recovery scanner, orphan cleanup.
    Worker {
        #[command(flatten)]
        backends: Backends,
        #[command(flatten)]
        lifecycle: LifecycleArgs,
    },
    /// Run the relay alone (outbox → Kafka); any number of instances.
    Relay(cmd_relay::RelayArgs),
    /// Backlog, claims, lag, dead letters, intents, jobs, latency, generations.
    Status(cmd_status::StatusArgs),
    /// Inspect the outbox and redrive rows the relay set aside.
    Outbox(cmd_outbox::OutboxArgs),
    /// Run one subscription (search, stats or notify) alone.
    Consume(cmd_consume::ConsumeArgs),
    /// Run the notification dispatcher alone.
    Dispatch {
        #[command(flatten)]
        backends: Backends,
        #[command(flatten)]
        notify: NotifyArgs,
    },
    /// Reconcile notifications whose outcome is unknown; redrive failed and conflicting ones.
    Notify(cmd_notify::NotifyCmdArgs),
    /// A reference notification receiver with a durable ledger and fault switches.
    ProviderSim(cmd_provider_sim::ProviderSimArgs),
    /// Rebuild a projection into a new generation, switch, roll back, status.
    Rebuild(cmd_rebuild::RebuildArgs),
    /// Export a projection's active generation with its positions (for rebuilds across a history gap).
    Snapshot(herald::cmd_snapshot::SnapshotArgs),
    /// Inspect and redrive dead letters.
    Dlq(cmd_dlq::DlqArgs),
    /// Inbox maintenance (retention).
    Inbox(cmd_inbox::InboxArgs),
    /// Remove rows that have done their job once older than a retention (floors read from the broker).
    Prune(cmd_prune::PruneArgs),
    /// Event data schemas: `check` their evolution under the declared modes.
    Schemas(herald::cmd_schemas::SchemasArgs),
    /// Check every invariant against the database, Kafka, artifacts and the provider.
    Audit(cmd_audit::AuditArgs),
    /// The pipeline as separate processes under SIGKILLs and a broker stop, then drained and audited.
    Drill(drill::DrillArgs),
    /// Benchmarks.
    Bench(bench::BenchArgs),
    /// The configuration file: `show` what a command would run with.
    Config(cmd_config::ConfigArgs),
    /// Apply this release's database migrations (the only command that changes the schema).
    Migrate(herald::cmd_migrate::MigrateArgs),
}

fn main() -> ExitCode {
    let (cli, file, name) = match parse_cli(std::env::args_os().collect()) {
        Ok(parsed) => parsed,
        Err(code) => return code,
    };
    // The demo's output is its report; roles that run for long log progress.
    let default_filter =
        if matches!(cli.command, Command::Demo(_) | Command::Bench(_) | Command::Audit(_) | Command::Drill(_)) { "warn" } else { "info" };
    let format = match cli.log_format {
        LogFormat::Text => herald_trace::LogFormat::Text,
        LogFormat::Json => herald_trace::LogFormat::Json,
    };
    let tracing = match herald_trace::init(format, default_filter) {
        Ok(tracing) => tracing,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let span = herald_trace::process_span(&name);
    let outcome = runtime.block_on(run(cli.command, file).instrument(span.clone()));
    // The exporter's client blocks: flush the last spans outside the runtime.
    drop(runtime);
    let code = span.in_scope(|| exit_code(outcome, format));
    drop(span);
    tracing.shutdown();
    code
}

/// The command's exit code; its error, if any, on stderr: a plain message,
/// or with `--log-format json` a log line like every other (with the ids of
/// the command's span).
fn exit_code(outcome: anyhow::Result<ExitCode>, format: herald_trace::LogFormat) -> ExitCode {
    let e = match outcome {
        Ok(code) => return code,
        Err(e) => e,
    };
    // An operator's decision, or flags that contradict each other: exit 2 like bad input.
    let rejected = e.downcast_ref::<notify_start::Refused>().is_some()
        || e.downcast_ref::<InvalidNotifyArgs>().is_some()
        || e.downcast_ref::<herald_fault::SpecError>().is_some()
        || e.downcast_ref::<herald::connection::BadConnection>().is_some();
    let (message, code) = if rejected { (format!("{e}"), ExitCode::from(2)) } else { (format!("{e:#}"), ExitCode::FAILURE) };
    // A filter that silences errors must not silence this one.
    if format == herald_trace::LogFormat::Json && tracing::enabled!(tracing::Level::ERROR) {
        tracing::error!(error = %message, exit_code = if rejected { 2 } else { 1 }, "herald stopped");
    } else {
        eprintln!("error: {message}");
    }
    code
}

/// The command line with `herald.toml` (`--config`, `HERALD_CONFIG`) under
/// it; a bad file or bad flags print their error and give the exit code.
fn parse_cli(argv: Vec<OsString>) -> Result<(Cli, Option<ConfigFile>, String), ExitCode> {
    let command = Cli::command();
    let usage_error = |e: clap::Error| {
        let usage = e.use_stderr();
        let _ = e.print();
        // clap uses 2 for usage errors; help and version are successes.
        if usage { ExitCode::from(2) } else { ExitCode::SUCCESS }
    };
    let file_error = |e: config_file::ConfigError| {
        eprintln!("error: {e}");
        ExitCode::from(2)
    };
    let file = config_file::locate(&command, &argv).map(|path| ConfigFile::load(&path)).transpose().map_err(file_error)?;
    let resolved = match &file {
        Some(file) => config_file::resolve(&command, argv, file).map_err(file_error)?,
        None => Resolved { argv, from_file: Default::default() },
    };
    let matches = config_file::parse(&command, &resolved, file.as_ref()).map_err(usage_error)?;
    let cli = Cli::from_arg_matches(&matches).map_err(usage_error)?;
    let name = matches.subcommand_name().unwrap_or("herald").to_owned();
    Ok((cli, file, name))
}

async fn run(command: Command, file: Option<ConfigFile>) -> anyhow::Result<ExitCode> {
    match command {
        Command::Demo(args) => demo::run(args).await,
        Command::Serve { backends, listen, lifecycle, notify, notify_start_at, prune, routing } => {
            let (lifecycle, notify, prune) = (Some(&lifecycle), Some(&notify), Some(&prune));
            serve(backends, Roles::all(&listen), lifecycle, notify, notify_start_at, prune, Some(&routing)).await
        }
        Command::Api { backends, listen, lifecycle } => {
            let roles = Roles { api: Some(listen), relay: false, worker: false, subscriptions: false, dispatcher: false };
            serve(backends, roles, Some(&lifecycle), None, None, None, None).await
        }
        Command::Worker { backends, lifecycle } => {
            let roles = Roles { api: None, relay: false, worker: true, subscriptions: false, dispatcher: false };
            serve(backends, roles, Some(&lifecycle), None, None, None, None).await
        }
        Command::Relay(args) => cmd_relay::run(args).await,
        Command::Status(args) => cmd_status::run(args).await,
        Command::Outbox(args) => cmd_outbox::run(args).await,
        Command::Dispatch { backends, notify } => {
            if notify.notify_url.is_none() && backends.database.url.is_some() {
                eprintln!("error: --notify-url (or HERALD_NOTIFY_URL) is required with a real database");
                return Ok(ExitCode::from(2));
            }
            let roles = Roles { api: None, relay: false, worker: false, subscriptions: false, dispatcher: true };
            serve(backends, roles, None, Some(&notify), None, None, None).await
        }
        Command::Notify(args) => cmd_notify::run(args).await,
        Command::Rebuild(args) => cmd_rebuild::run(args).await,
        Command::Snapshot(args) => herald::cmd_snapshot::run(args).await,
        Command::ProviderSim(args) => cmd_provider_sim::run(args).await,
        Command::Consume(args) => cmd_consume::run(args).await,
        Command::Dlq(args) => cmd_dlq::run(args).await,
        Command::Inbox(args) => cmd_inbox::run(args).await,
        Command::Prune(args) => cmd_prune::run(args).await,
        Command::Schemas(args) => herald::cmd_schemas::run(args).await,
        Command::Audit(args) => cmd_audit::run(args).await,
        Command::Drill(args) => drill::run(args).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Config(args) => Ok(cmd_config::run(&Cli::command(), file.as_ref(), args)),
        Command::Migrate(args) => herald::cmd_migrate::run(args).await,
    }
}

/// The observer token made at start, to print: one the operator gave is
/// never shown.
fn generated_observe_token(lifecycle: Option<&LifecycleArgs>, observe: &pipeline::Observe) -> Option<String> {
    let given = lifecycle.is_some_and(|l| l.observe_token.is_some() || l.observe_listen.is_some());
    match observe {
        pipeline::Observe::OnApi(herald_api::observe::Access::Bearer(token)) if !given => Some(token.expose().to_owned()),
        _ => None,
    }
}

/// Runs `roles` in this process; `routing` is the relay role's when it
/// has flags of its own (`herald serve`).
async fn serve(
    backends: Backends,
    roles: Roles,
    lifecycle: Option<&LifecycleArgs>,
    notify: Option<&NotifyArgs>,
    notify_start_at: Option<StartAt>,
    prune: Option<&cmd_prune::ServePrune>,
    routing: Option<&herald::topic_args::RouteArgs>,
) -> anyhow::Result<ExitCode> {
    let mut options = lifecycle.map(LifecycleArgs::options).transpose()?.unwrap_or_default();
    if let Some(routing) = routing {
        // Bad routing is bad input: refused before anything starts.
        options.routes = Some(routing.routes(&backends.topics().events)?);
        options.dataschema_base = routing.dataschema_base()?;
    }
    options.notify_start_at = notify_start_at;
    options.registry = backends.registry()?;
    options.notify = backends.notify_handler()?;
    // One hook for every role this process runs; a bad spec is bad input.
    options.faults = herald_fault::from_env()?;
    if let (true, Some(notify)) = (roles.dispatcher, notify) {
        notify.validate()?;
    }
    let env = backends.resolve().await?;
    if let (true, Some(routes)) = (roles.relay && backends.kafka.brokers.is_some(), &options.routes) {
        // resolve() made Herald's topics; these are the ones routes add.
        herald::topic_args::ensure_routed(&env.wiring.kafka, &env.wiring.topics, routes, backends.topic.settings()).await?;
    }
    if let Some(prune) = prune {
        match prune.schedule(&env.wiring).await {
            Ok(schedule) => options.prune = schedule,
            Err(refusal) => {
                eprintln!("error: --prune-older-than-days: {refusal}");
                return Ok(ExitCode::from(2));
            }
        }
    }
    if let (true, Some(notify)) = (roles.dispatcher, notify) {
        let (url, caps) = match &notify.notify_url {
            Some(url) => (url.clone(), notify.capabilities()),
            None => {
                let embedded = herald_proof::embedded::start_provider(&env, Default::default()).await?;
                (embedded.url, embedded.caps)
            }
        };
        let (client, config) = notify.dispatcher(&url, caps)?;
        options.dispatch = Some(pipeline::Dispatch { client, config });
    }
    let generated_observer = generated_observe_token(lifecycle, &options.observe);
    let running = pipeline::start_roles(env.wiring.clone(), roles, options).await?;
    if let Some(addr) = running.api_addr {
        println!("herald listening on http://{addr}");
        match (running.observe_addr, generated_observer) {
            (Some(observe), _) => println!("dashboard http://{observe}/status, Prometheus metrics http://{observe}/metrics"),
            (None, Some(token)) => println!(
                "dashboard http://{addr}/status#token={token}, Prometheus metrics http://{addr}/metrics with Authorization: Bearer {token}"
            ),
            (None, None) => {
                println!("dashboard http://{addr}/status, Prometheus metrics http://{addr}/metrics (with the observer token you gave)")
            }
        }
        if let Some(token) = &env.default_token {
            println!("API token for caller `demo`: {token}");
            println!(
                "try: curl -H 'Authorization: Bearer {token}' -H 'Idempotency-Key: k1' -d '{{\"format\":\"csv\",\"query\":\"hello\"}}' http://{addr}/v1/exports"
            );
        }
    }
    let shutdown: CancellationToken = running.shutdown.clone();
    tokio::spawn(
        async move {
            herald::signals::wait_for_stop().await;
            info!("shutdown requested; draining");
            shutdown.cancel();
        }
        .in_current_span(),
    );
    running.until_stopped().await?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
#[path = "main_config_tests.rs"]
mod config_tests;
