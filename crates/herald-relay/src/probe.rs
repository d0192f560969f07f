//! Fault-injection points. Production uses [`NoProbe`]; tests plug in a probe
//! that waits at a gate or loses an acknowledgement, so races are forced
//! deterministically instead of being hoped for with sleeps.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;

/// What the relay does after a probe point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeAction {
    Continue,
    /// Behave as if the process died between the broker's ack and the
    /// progress write: the write is not made and the rows stay unrecorded.
    LoseAck,
}

pub trait Probe: Send + Sync {
    /// After a batch of `slice` was acknowledged, before its progress write.
    fn before_progress(&self, _slice: i32, _rows: usize) -> BoxFuture<'_, ProbeAction> {
        Box::pin(async { ProbeAction::Continue })
    }
}

/// The probe of production: does nothing.
pub struct NoProbe;

impl Probe for NoProbe {}

/// A shareable probe in the relay's configuration.
#[derive(Clone)]
pub struct Probes(pub Arc<dyn Probe>);

impl Default for Probes {
    fn default() -> Self {
        Probes(Arc::new(NoProbe))
    }
}

impl fmt::Debug for Probes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Probes")
    }
}
