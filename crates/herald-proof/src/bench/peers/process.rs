//! A measured process: its resident set and the CPU time it has used, from
//! `/proc/<pid>`.

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
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = stat.rsplit_once(')').context("malformed /proc/pid/stat")?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let (utime, stime): (f64, f64) = (fields[11].parse()?, fields[12].parse()?);
        Ok((utime + stime) / self.ticks_per_sec)
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

/// CPU seconds of every local `postgres` process so far (running ones, and
/// the postmaster's reaped children): the database's share of the work,
/// when the server runs on this machine (`None` otherwise).
pub(super) fn postgres_cpu_secs() -> anyhow::Result<Option<f64>> {
    let ticks = clock_ticks()?;
    let (mut total, mut found) = (0.0, false);
    for entry in std::fs::read_dir("/proc")? {
        let path = entry?.path();
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else { continue };
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        if !head.ends_with("(postgres") {
            continue;
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime, stime, cutime, cstime (fields 14-17 of proc(5)).
        let sum: f64 = fields.get(11..15).into_iter().flatten().filter_map(|f| f.parse::<f64>().ok()).sum();
        (total, found) = (total + sum, true);
    }
    Ok(found.then_some(total / ticks))
}

fn clock_ticks() -> anyhow::Result<f64> {
    let out = std::process::Command::new("getconf").arg("CLK_TCK").output().context("getconf CLK_TCK")?;
    String::from_utf8_lossy(&out.stdout).trim().parse().context("getconf CLK_TCK")
}

/// How often progress is polled while a system drains or catches up.
pub(super) const POLL: Duration = Duration::from_millis(100);
