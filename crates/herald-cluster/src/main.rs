//! `herald-cluster`: runs an Apache Kafka cluster in the foreground until
//! SIGTERM or SIGINT, for `scripts/test` and for a developer's shell.
//! When every node is listed in the metadata it writes `KEY=VALUE` lines
//! to `--env-file` (and stdout), for `scripts/test` to source:
//!
//! - `HERALD_TEST_KAFKA_BROKERS`: the PLAINTEXT bootstrap servers
//! - `HERALD_TEST_KAFKA_SASL_BROKERS`: the SASL_SSL bootstrap servers
//! - `HERALD_TEST_KAFKA_CA`: the CA certificate (PEM) to trust
//! - `HERALD_TEST_KAFKA_UNTRUSTED_CA`: a CA certificate (PEM) the brokers'
//!   certificate does not chain to, for tests of a refusing client
//! - `HERALD_TEST_KAFKA_SASL_USERNAME`, `HERALD_TEST_KAFKA_SASL_PASSWORD`:
//!   the one user, for SCRAM-SHA-512 and PLAIN alike

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use herald_cluster::{Cluster, Jit};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser)]
#[command(about = "Run an Apache Kafka KRaft cluster on loopback until SIGTERM/SIGINT")]
struct Args {
    /// Combined broker+controller nodes.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Directory for the nodes' storage and logs (created).
    #[arg(long)]
    dir: PathBuf,
    /// The broker's jars (scripts/kafka-fetch).
    #[arg(long, env = herald_cluster::KAFKA_HOME_ENV)]
    kafka_home: PathBuf,
    /// Written once the cluster is ready: `HERALD_TEST_KAFKA_BROKERS=...`
    /// and the SASL_SSL settings, one `KEY=VALUE` a line.
    #[arg(long)]
    env_file: Option<PathBuf>,
    /// Full tiered JIT compilation (as production brokers run) instead of
    /// C1 only: slower to start, cheaper per request once warm; for a
    /// cluster that benchmarks run against.
    #[arg(long)]
    steady_jit: bool,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (home, dir, nodes) = (args.kafka_home.clone(), args.dir.clone(), args.nodes);
    let jit = if args.steady_jit { Jit::Steady } else { Jit::QuickStart };
    let cluster = tokio::task::spawn_blocking(move || Cluster::start_with(&home, &dir, nodes, jit)).await??;
    let lines = env_lines(&cluster);
    if let Some(file) = &args.env_file {
        // Written whole, then renamed, so a reader never sees half of it.
        let partial = file.with_extension("partial");
        std::fs::write(&partial, &lines)?;
        std::fs::rename(&partial, file).with_context(|| format!("writing {}", file.display()))?;
    }
    print!("{lines}");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    drop(cluster);
    Ok(())
}

/// Sourced by a shell: no value may hold a space or a quote, which holds
/// for loopback addresses, a hex password and `scripts/test`'s paths.
fn env_lines(cluster: &Cluster) -> String {
    let secure = cluster.secure();
    [
        ("HERALD_TEST_KAFKA_BROKERS", cluster.bootstrap()),
        ("HERALD_TEST_KAFKA_SASL_BROKERS", secure.bootstrap().to_owned()),
        ("HERALD_TEST_KAFKA_CA", secure.ca_path().display().to_string()),
        ("HERALD_TEST_KAFKA_UNTRUSTED_CA", secure.untrusted_ca_path().display().to_string()),
        ("HERALD_TEST_KAFKA_SASL_USERNAME", secure.username().to_owned()),
        ("HERALD_TEST_KAFKA_SASL_PASSWORD", secure.password().to_owned()),
    ]
    .iter()
    .map(|(key, value)| format!("{key}={value}\n"))
    .collect()
}
