//! A measured process: its resident set and the CPU time it has used, from
//! `/proc/<pid>`.

use std::ops::Range;
use std::time::Duration;

use anyhow::Context;
use tokio::process::Child;

use crate::bench::memory;

pub(super) struct Measured {
    pub child: Child,
    pub pid: u32,
    ticks_per_sec: f64,
}

impl Measured {
    pub fn new(child: Child) -> anyhow::Result<Measured> {
        let pid = child.id().context("the process exited at once")?;
        Ok(Measured { child, pid, ticks_per_sec: clock_ticks()? })
    }

    /// User + system CPU seconds so far.
    pub fn cpu_secs(&self) -> anyhow::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))?;
        let (_, ticks) = cpu_ticks(&stat, OWN).context("malformed /proc/pid/stat")?;
        Ok(ticks / self.ticks_per_sec)
    }

    /// CPU seconds of every local `postgres` process so far (running ones,
    /// and the postmaster's reaped children): the database's share of the
    /// work, when the server runs on this machine (`None` otherwise).
    pub fn postgres_cpu_secs(&self) -> anyhow::Result<Option<f64>> {
        let (mut total, mut found) = (0.0, false);
        for entry in std::fs::read_dir("/proc")? {
            let Ok(stat) = std::fs::read_to_string(entry?.path().join("stat")) else { continue };
            if let Some(("postgres", ticks)) = cpu_ticks(&stat, WITH_CHILDREN) {
                (total, found) = (total + ticks, true);
            }
        }
        Ok(found.then_some(total / self.ticks_per_sec))
    }

    /// The kernel's high-water mark of the resident set, MB.
    pub fn peak_rss_mb(&self) -> anyhow::Result<f64> {
        Ok(memory::status_kb(self.pid, "VmHWM")? as f64 / 1024.0)
    }

    /// Fails if the process has exited.
    pub fn alive(&mut self, what: &str) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            anyhow::bail!("{what} exited ({status})");
        }
        Ok(())
    }

    pub async fn stop(mut self) -> anyhow::Result<()> {
        memory::stop(&mut self.child, self.pid).await
    }
}

/// utime, stime (fields 14-15 of proc(5), counted after the command name).
const OWN: Range<usize> = 11..13;
/// utime, stime, cutime, cstime (fields 14-17).
const WITH_CHILDREN: Range<usize> = 11..15;

/// The command name and the sum of `fields` of a `/proc/<pid>/stat` line;
/// the name is in parentheses and may hold spaces and parentheses itself.
fn cpu_ticks(stat: &str, fields: Range<usize>) -> Option<(&str, f64)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let name = head.split_once('(')?.1;
    let values: Vec<&str> = rest.split_whitespace().collect();
    let sum = values.get(fields)?.iter().map(|f| f.parse::<f64>().ok()).sum::<Option<f64>>()?;
    Some((name, sum))
}

fn clock_ticks() -> anyhow::Result<f64> {
    let out = std::process::Command::new("getconf").arg("CLK_TCK").output().context("getconf CLK_TCK")?;
    String::from_utf8_lossy(&out.stdout).trim().parse().context("getconf CLK_TCK")
}

/// How often progress is polled while a system drains or catches up.
pub(super) const POLL: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cpu_ticks_after_a_command_name_with_spaces_and_parentheses() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 10 0 0 0 7 3 5 1 20 0 1 0 100 0 0";
        assert_eq!(cpu_ticks(stat, OWN), Some(("a (b) c", 10.0)));
        assert_eq!(cpu_ticks(stat, WITH_CHILDREN), Some(("a (b) c", 16.0)));
        assert_eq!(cpu_ticks("42 (x) S 1", OWN), None, "a truncated line is not read as zero");
    }
}
