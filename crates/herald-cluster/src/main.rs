//! `herald-cluster`: runs an Apache Kafka cluster in the foreground until
//! SIGTERM or SIGINT, for `scripts/test` and for a developer's shell.
//! When every node is listed in the metadata it writes
//! `HERALD_TEST_KAFKA_BROKERS=<bootstrap>` to `--env-file` (and stdout).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use herald_cluster::Cluster;
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
    /// Written once the cluster is ready: `HERALD_TEST_KAFKA_BROKERS=...`.
    #[arg(long)]
    env_file: Option<PathBuf>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (home, dir, nodes) = (args.kafka_home.clone(), args.dir.clone(), args.nodes);
    let cluster = tokio::task::spawn_blocking(move || Cluster::start(&home, &dir, nodes)).await??;
    let line = format!("HERALD_TEST_KAFKA_BROKERS={}\n", cluster.bootstrap());
    if let Some(file) = &args.env_file {
        // Written whole, then renamed, so a reader never sees half a line.
        let partial = file.with_extension("partial");
        std::fs::write(&partial, &line)?;
        std::fs::rename(&partial, file).with_context(|| format!("writing {}", file.display()))?;
    }
    print!("{line}");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    drop(cluster);
    Ok(())
}
