//! Private Apache Kafka clusters for the tests that kill, restart or cut off
//! brokers: the shared cluster of `scripts/test` must never see that, so
//! such a test starts a cluster of its own from the jars in
//! `HERALD_KAFKA_HOME`.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

use herald_cluster::Cluster;

/// A cluster that lives as long as the test holds it; its storage goes with
/// it. Holding one also holds the process-wide turn (see [`start`]).
pub struct PrivateCluster {
    cluster: Cluster,
    // Field order matters: the nodes are killed before their storage goes.
    _dir: tempfile::TempDir,
    _turn: MutexGuard<'static, ()>,
}

static TURN: Mutex<()> = Mutex::new(());

/// Starts a private cluster of `nodes` nodes. Tests of one binary that ask
/// for one run one at a time: three more JVMs per test would starve a
/// 2-core machine, and a test that kills brokers must not slow the others
/// into timeouts.
pub fn start(nodes: usize) -> anyhow::Result<PrivateCluster> {
    // A test that panicked while holding the turn poisons it; the next one
    // may still run (its cluster is a new one).
    let turn = TURN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let home = herald_cluster::kafka_home_from_env()?;
    let dir = tempfile::Builder::new().prefix("herald-cluster-").tempdir()?;
    let cluster = Cluster::start(&home, dir.path(), nodes)?;
    Ok(PrivateCluster { cluster, _dir: dir, _turn: turn })
}

impl Deref for PrivateCluster {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

impl DerefMut for PrivateCluster {
    fn deref_mut(&mut self) -> &mut Cluster {
        &mut self.cluster
    }
}
