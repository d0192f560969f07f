//! Lines from the `log` crate (librdkafka's, through rdkafka) as tracing
//! events inside the process's span.
//!
//! librdkafka logs on threads of its own, where no span is current; bridged
//! as they are, its lines (a broker down, a failed connection) would be the
//! only JSON lines without trace ids. They are emitted inside the span of
//! the command the process runs instead, the one its other lines outside a
//! unit of work carry.

use std::sync::Mutex;

use tracing::Span;
use tracing_log::{AsLog, LogTracer};

/// Held until [`release`], so the span closes (and is exported) at exit.
static PROCESS: Mutex<Option<Span>> = Mutex::new(None);

/// Installs the bridge. Call once the subscriber is the global default, so
/// the `log` crate's maximum level follows the subscriber's.
pub(crate) fn install() -> Result<(), log::SetLoggerError> {
    log::set_boxed_logger(Box::new(Bridge(LogTracer::new())))?;
    log::set_max_level(tracing::level_filters::LevelFilter::current().as_log());
    Ok(())
}

/// The root span of the command this process runs (see [`crate::run_span`]);
/// `log` lines from threads without a span are emitted inside it.
pub fn process_span(command: &str) -> Span {
    let span = crate::run_span(command);
    *lock() = Some(span.clone());
    span
}

/// Lets the process span close; `log` lines after this carry no ids.
pub(crate) fn release() {
    lock().take();
}

fn lock() -> std::sync::MutexGuard<'static, Option<Span>> {
    // Only a clone or a take happens under the lock; a poisoned one holds a
    // span as good as before.
    PROCESS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct Bridge(LogTracer);

impl log::Log for Bridge {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        self.0.enabled(metadata)
    }

    fn log(&self, record: &log::Record<'_>) {
        let fallback = if Span::current().is_none() { lock().clone() } else { None };
        let _entered = fallback.as_ref().map(Span::enter);
        self.0.log(record);
    }

    fn flush(&self) {}
}
