//! The CPU a measurement used: the whole machine's (`/proc/stat`) and this
//! process's (`/proc/self/stat`), read at its start and end. A rate means
//! little on a shared 2-core machine without it: when two measurements both
//! kept every core busy, their rates stand in the inverse ratio of what an
//! event cost, and that ratio is the best the slower one can do here.
//!
//! Both readings count in the kernel's clock ticks, so no tick rate is
//! needed. Off Linux (no `/proc`) there is no reading and reports omit it.

use std::time::Instant;

use serde_json::{Value, json};

/// Counters at one instant.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuMark {
    at: Instant,
    machine_busy: u64,
    machine_total: u64,
    process: u64,
    cpus: usize,
}

/// What a measurement used between two marks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuUse {
    /// Cores the whole machine kept busy, on average (at most `cpus`).
    pub(crate) machine_cores: f64,
    /// Cores this process used (its threads, and the mock cluster's when it runs in-process).
    pub(crate) process_cores: f64,
    pub(crate) cpus: usize,
    secs: f64,
}

impl CpuMark {
    pub(crate) fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        let (machine_busy, machine_total) = machine_ticks(&stat)?;
        let cpus = stat.lines().filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit)).count();
        Some(Self { at: Instant::now(), machine_busy, machine_total, process: process_ticks(&own)?, cpus })
    }

    /// The use from this mark to now.
    pub(crate) fn used(&self) -> Option<CpuUse> {
        let end = Self::now()?;
        let total = end.machine_total.checked_sub(self.machine_total).filter(|t| *t > 0)? as f64;
        let share = |ticks: u64| ticks as f64 / total * self.cpus as f64;
        Some(CpuUse {
            machine_cores: share(end.machine_busy.saturating_sub(self.machine_busy)),
            process_cores: share(end.process.saturating_sub(self.process)),
            cpus: self.cpus,
            secs: end.at.duration_since(self.at).as_secs_f64(),
        })
    }
}

impl CpuUse {
    /// Microseconds of CPU, all processes together, per event.
    pub(crate) fn us_per_event(&self, events: u64) -> f64 {
        self.machine_cores * self.secs * 1e6 / events.max(1) as f64
    }

    /// Microseconds of this process's CPU per event.
    pub(crate) fn process_us_per_event(&self, events: u64) -> f64 {
        self.process_cores * self.secs * 1e6 / events.max(1) as f64
    }

    /// One line for a table: cores busy, and the CPU per event split into
    /// this process's (`own`: what runs in it, e.g. the mock cluster) and
    /// the other processes' (`others`: PostgreSQL, brokers not in-process).
    pub(crate) fn line(&self, name: &str, events: u64, own: &str, others: &str) -> String {
        let (all, mine) = (self.us_per_event(events), self.process_us_per_event(events));
        format!(
            "{name}: {:.2} of {} cores busy, {all:.2} µs of CPU per event ({mine:.2} in {own}, {:.2} in {others})",
            self.machine_cores,
            self.cpus,
            all - mine
        )
    }

    pub(crate) fn to_json(self, events: u64) -> Value {
        let round = |x: f64| (x * 100.0).round() / 100.0;
        json!({
            "machine_cores": round(self.machine_cores), "process_cores": round(self.process_cores), "cpus": self.cpus,
            "us_per_event": round(self.us_per_event(events)), "process_us_per_event": round(self.process_us_per_event(events)),
        })
    }
}

/// Busy and total ticks of all cores from `/proc/stat`'s first line
/// (`cpu user nice system idle iowait irq softirq steal …`): idle and iowait
/// are not busy; guest time is already inside user.
fn machine_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line.split_whitespace().take(8).map(str::parse).collect::<Result<_, _>>().ok()?;
    let [user, nice, system, idle, iowait, irq, softirq, steal] = ticks.try_into().ok()?;
    let busy = user + nice + system + irq + softirq + steal;
    Some((busy, busy + idle + iowait))
}

/// User plus system ticks from `/proc/<pid>/stat` (fields 14 and 15; the
/// command name in parentheses may hold spaces, so count after its `)`).
fn process_ticks(stat: &str) -> Option<u64> {
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_leaves_out_idle_and_iowait() {
        let stat = "cpu  100 5 20 1000 30 2 3 4 0 0\ncpu0 50 2 10 500 15 1 1 2 0 0\n";
        assert_eq!(machine_ticks(stat), Some((134, 1164)));
    }

    #[test]
    fn a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        let stat = "4242 (tokio (rt) worker) S 1 4242 4242 0 -1 4194304 10 0 0 0 77 23 0 0 20 0 9 0 100 0 0";
        assert_eq!(process_ticks(stat), Some(100));
    }

    #[test]
    fn a_line_splits_the_cost_between_this_process_and_the_others() {
        let used = CpuUse { machine_cores: 1.5, process_cores: 1.0, cpus: 2, secs: 2.0 };
        assert_eq!(
            used.line("relay", 1_000_000, "here", "there"),
            "relay: 1.50 of 2 cores busy, 3.00 µs of CPU per event (2.00 in here, 1.00 in there)"
        );
    }

    #[test]
    fn a_busy_loop_shows_in_both_readings() {
        let Some(mark) = CpuMark::now() else { return };
        let until = Instant::now() + std::time::Duration::from_millis(500);
        let mut spins = 0u64;
        while Instant::now() < until {
            spins = std::hint::black_box(spins + 1);
        }
        let used = mark.used().expect("a second reading");
        assert!(used.process_cores > 0.2, "one thread spinning for 500 ms used {:.2} cores", used.process_cores);
        assert!(used.machine_cores >= used.process_cores * 0.8, "{used:?}");
        assert!(used.us_per_event(1) > 50_000.0, "{used:?}");
    }
}
