//! Synchronisation for race tests.

use std::sync::Arc;

use tokio::sync::Barrier;

/// Lets N tasks reach a point and then go on together.
///
/// Race tests (two relays claiming the same outbox rows, a consumer and a
/// redelivery committing the same event) prove nothing if one side finishes
/// before the other starts; sleeping to line them up is slow and still
/// flaky. Each party calls [`Gate::arrive_and_wait`] right before the
/// contended step and none proceeds until all have arrived. Cloning is cheap
/// and every clone is the same gate, so it can be moved into spawned tasks.
#[derive(Clone, Debug)]
pub struct Gate(Arc<Barrier>);

impl Gate {
    /// A gate that opens once `parties` tasks are waiting at it. It opens
    /// again for each following group of `parties` arrivals.
    pub fn new(parties: usize) -> Self {
        Self(Arc::new(Barrier::new(parties)))
    }

    /// Waits until all parties have arrived.
    pub async fn arrive_and_wait(&self) {
        self.0.wait().await;
    }
}

/// Polls `check` until it holds, or fails after `within` naming `what`. For
/// outcomes that are eventual by design (a pipeline draining, a lag going
/// to zero): the test decides how long it is willing to wait, not when the
/// outcome happens, so a slow machine makes it slower, not flaky.
pub async fn wait_until<F, Fut>(what: &str, within: std::time::Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = std::time::Instant::now() + within;
    while !check().await? {
        anyhow::ensure!(std::time::Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn nobody_passes_before_everyone_arrived() -> anyhow::Result<()> {
        let gate = Gate::new(3);
        let arrived = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let (gate, arrived) = (gate.clone(), arrived.clone());
            tasks.push(tokio::spawn(async move {
                arrived.fetch_add(1, Ordering::SeqCst);
                gate.arrive_and_wait().await;
                arrived.load(Ordering::SeqCst)
            }));
        }
        for task in tasks {
            let seen = tokio::time::timeout(Duration::from_secs(5), task).await??;
            assert_eq!(seen, 3);
        }
        Ok(())
    }
}
