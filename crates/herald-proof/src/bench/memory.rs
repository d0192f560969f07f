//! Resident memory of a Herald role as users run it — its own `herald`
//! process — while it works through a backlog: sampled from
//! `/proc/<pid>/status` every 100 ms, with the kernel's high-water mark
//! (`VmHWM`) read before the process is stopped, so a spike between two
//! samples still counts. "Flat" is read off the samples by progress: the
//! resident set at each tenth of the backlog.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use tokio::process::{Child, Command};

/// How often the resident set is sampled.
const EVERY: Duration = Duration::from_millis(100);
/// How often progress (a database count, itself work for the database) is read.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// One role's memory through one backlog.
#[derive(Debug, Clone)]
pub(crate) struct Memory {
    pub(crate) peak_mb: f64,
    /// Resident set (MB) when 10 %, 20 %, … 100 % of the backlog was done.
    pub(crate) by_tenth_mb: Vec<f64>,
    pub(crate) secs: f64,
}

impl Memory {
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let round = |x: f64| (x * 10.0).round() / 10.0;
        json!({"peak_rss_mb": round(self.peak_mb), "rss_mb_by_tenth": self.by_tenth_mb.iter().map(|x| round(*x)).collect::<Vec<_>>(), "secs": round(self.secs)})
    }

    pub(crate) fn line(&self, what: &str) -> String {
        let tenths = self.by_tenth_mb.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" / ");
        format!("{what}: peak RSS {:.1} MB over {:.1} s; RSS (MB) at each tenth of the backlog: {tenths}", self.peak_mb, self.secs)
    }
}

/// Runs `herald <args>` until `progress()` reports `want` units done (or
/// `limit` passes), sampling its memory, then stops it with SIGTERM.
pub(crate) async fn of_role<F, Fut>(args: &[String], want: u64, limit: Duration, mut progress: F) -> anyhow::Result<Memory>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<u64>>,
{
    let mut child = Command::new(std::env::current_exe()?)
        .args(args)
        .env("HERALD_LOG", "warn")
        .env_remove("HERALD_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting herald {}", args.join(" ")))?;
    let pid = child.id().context("the role exited at once")?;
    let started = Instant::now();
    let (mut by_tenth, mut peak_kb, mut done, mut last_progress) = (Vec::new(), 0u64, 0u64, Instant::now() - PROGRESS_EVERY);
    while done < want {
        anyhow::ensure!(started.elapsed() < limit, "herald {} did {done} of {want} in {limit:?}", args[0]);
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("herald {} exited ({status}) after {done} of {want}", args[0]);
        }
        let rss = status_kb(pid, "VmRSS")?;
        peak_kb = peak_kb.max(rss);
        if last_progress.elapsed() >= PROGRESS_EVERY {
            done = progress().await?;
            last_progress = Instant::now();
            while by_tenth.len() < 10 && done * 10 >= want * (by_tenth.len() as u64 + 1) {
                by_tenth.push(rss as f64 / 1024.0);
            }
        }
        tokio::time::sleep(EVERY).await;
    }
    let secs = started.elapsed().as_secs_f64();
    peak_kb = peak_kb.max(status_kb(pid, "VmHWM")?);
    stop(&mut child, pid).await?;
    Ok(Memory { peak_mb: peak_kb as f64 / 1024.0, by_tenth_mb: by_tenth, secs })
}

/// A `kB` line of `/proc/<pid>/status`.
pub(crate) fn status_kb(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("reading /proc/{pid}/status"))?;
    parse_kb(&status, field).with_context(|| format!("no {field} in /proc/{pid}/status"))
}

fn parse_kb(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.strip_prefix(field).is_some_and(|rest| rest.starts_with(':')))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// SIGTERM, as an operator stops a role; it drains and exits.
pub(crate) async fn stop(child: &mut Child, pid: u32) -> anyhow::Result<()> {
    Command::new("kill").args(["-TERM", &pid.to_string()]).status().await?;
    match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
        Ok(status) => {
            status?;
        }
        Err(_) => child.kill().await?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_kilobytes_of_a_status_field() {
        let status = "Name:\therald\nVmHWM:\t  51234 kB\nVmRSS:\t   40960 kB\n";
        assert_eq!(parse_kb(status, "VmRSS"), Some(40960));
        assert_eq!(parse_kb(status, "VmHWM"), Some(51234));
        assert_eq!(parse_kb(status, "VmSwap"), None);
    }
}
