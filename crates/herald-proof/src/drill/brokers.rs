//! The drill's brokers: a three-node Apache Kafka cluster the drill starts
//! itself and whose nodes it SIGKILLs and restarts, one down at a time; or a
//! cluster it is given, which it leaves alone.

use std::path::Path;
use std::time::{Duration, Instant};

use herald_cluster::Cluster;

/// No more kills after `settle`.
const FOREVER: Duration = Duration::from_secs(3600 * 24 * 365);
/// How long one look at the metadata may take.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(3);

pub struct Brokers {
    bootstrap: String,
    /// `None` for a cluster the drill was given.
    cluster: Option<Cluster>,
    every: Duration,
    down_for: Duration,
    state: State,
    pub kills: u64,
    pub restarts: u64,
}

enum State {
    /// All nodes up and in sync; the next kill is due at this instant.
    Up { next_kill: Instant },
    /// Node `id` was killed; it comes back at this instant.
    Down { id: i32, back_at: Instant },
    /// A node came back; no other is killed until every partition has all
    /// its replicas in sync again, so no acknowledged write ever rests on
    /// fewer than `min.insync.replicas` copies because of the drill itself.
    CatchingUp { next_look: Instant },
}

impl Brokers {
    /// Starts `nodes` nodes from the jars in `kafka_home` under `dir`.
    pub fn start(kafka_home: &Path, dir: &Path, nodes: usize, every: Duration, down_for: Duration) -> anyhow::Result<Brokers> {
        let cluster = tokio::task::block_in_place(|| Cluster::start(kafka_home, dir, nodes))?;
        Ok(Brokers {
            bootstrap: cluster.bootstrap(),
            cluster: Some(cluster),
            every,
            down_for,
            state: State::Up { next_kill: next(Instant::now(), every) },
            kills: 0,
            restarts: 0,
        })
    }

    /// A running cluster, never disturbed.
    pub fn given(bootstrap: &str) -> Brokers {
        Brokers {
            bootstrap: bootstrap.to_owned(),
            cluster: None,
            every: Duration::MAX,
            down_for: Duration::ZERO,
            state: State::Up { next_kill: Instant::now() },
            kills: 0,
            restarts: 0,
        }
    }

    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// One step of broker chaos; call it often.
    pub fn tick(&mut self) -> anyhow::Result<()> {
        let Some(cluster) = self.cluster.as_mut() else { return Ok(()) };
        let now = Instant::now();
        match self.state {
            State::Up { next_kill } if now >= next_kill => {
                let running: Vec<i32> = cluster.nodes().iter().filter(|n| n.is_running()).map(|n| n.id() as i32).collect();
                let Some(&id) = running.get(fastrand::usize(..running.len().max(1))) else { return Ok(()) };
                tracing::info!(node = id, "drill: SIGKILL broker");
                cluster.kill(id)?;
                self.kills += 1;
                self.state = State::Down { id, back_at: now + self.down_for };
            }
            State::Down { id, back_at } if now >= back_at => {
                tracing::info!(node = id, "drill: starting broker again");
                cluster.start_node(id)?;
                self.restarts += 1;
                self.state = State::CatchingUp { next_look: now };
            }
            State::CatchingUp { next_look } if now >= next_look => {
                let nodes = cluster.nodes().len();
                let health = tokio::task::block_in_place(|| cluster.health(HEALTH_TIMEOUT));
                self.state = match health {
                    Ok(h) if h.brokers == nodes && h.under_replicated == 0 && h.leaderless == 0 => {
                        State::Up { next_kill: next(now, self.every) }
                    }
                    _ => State::CatchingUp { next_look: now + Duration::from_secs(1) },
                };
            }
            _ => {}
        }
        Ok(())
    }

    /// Brings a node that is down back and waits for every node, for the
    /// drain and the audit.
    pub fn settle(&mut self) -> anyhow::Result<()> {
        let Some(cluster) = self.cluster.as_mut() else { return Ok(()) };
        if let State::Down { .. } = self.state {
            self.restarts += 1;
        }
        tokio::task::block_in_place(|| cluster.start_all())?;
        self.state = State::Up { next_kill: next(Instant::now(), FOREVER) };
        Ok(())
    }
}

/// Half to one and a half times `every` from `from`: kills at random
/// moments, not on a beat the system could fall into step with.
fn next(from: Instant, every: Duration) -> Instant {
    from.checked_add(every.min(FOREVER).mul_f64(0.5 + fastrand::f64())).unwrap_or(from + FOREVER)
}
