//! The drill's processes: every role as its own `herald` process, each one
//! killable with SIGKILL and restartable with the same arguments.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::process::{Child, Command};

/// A killed process comes back after this long (a new consumer joins its
/// group while the dead member's session may still be alive: the group
/// coordinator waits for that session to expire, which is the point).
const RESTART: Duration = Duration::from_millis(700);

/// One role instance.
pub struct Spec {
    /// Role, as counted in the table (`worker`, `relay`, `consume-search` …).
    pub role: &'static str,
    /// Instance name, unique (`worker-1`).
    pub name: String,
    pub args: Vec<String>,
}

struct Proc {
    spec: Spec,
    /// The `herald` binary this process runs (an upgrade drill changes it).
    exe: PathBuf,
    child: Option<Child>,
    /// When a stopped process is started again.
    restart_at: Option<Instant>,
    /// How many times it was started.
    starts: u32,
}

/// How to start a `herald` process: the default binary, its environment,
/// where its output goes.
struct Launcher {
    exe: PathBuf,
    env: Vec<(String, String)>,
    logs: PathBuf,
}

/// Starts, kills and restarts the drill's processes.
pub struct Procs {
    launcher: Launcher,
    procs: Vec<Proc>,
    pub kills: BTreeMap<&'static str, u64>,
    /// Processes that exited without being killed (counted, restarted).
    pub exits: BTreeMap<&'static str, u64>,
}

impl Procs {
    pub fn new(exe: PathBuf, env: Vec<(String, String)>, logs: &Path) -> Procs {
        Procs { launcher: Launcher { exe, env, logs: logs.to_owned() }, procs: Vec::new(), kills: BTreeMap::new(), exits: BTreeMap::new() }
    }

    /// Starts `spec` on the default binary.
    pub fn add(&mut self, spec: Spec) -> anyhow::Result<()> {
        let exe = self.launcher.exe.clone();
        self.add_on(spec, exe)
    }

    /// Starts `spec` on `exe`; restarts use the same binary.
    pub fn add_on(&mut self, spec: Spec, exe: PathBuf) -> anyhow::Result<()> {
        let mut proc = Proc { spec, exe, child: None, restart_at: None, starts: 0 };
        self.launcher.spawn(&mut proc)?;
        self.procs.push(proc);
        Ok(())
    }

    /// A one-off `exe` command (`migrate`, `rebuild`) with the processes'
    /// environment, its output to the log `name`.
    pub fn one_off(&self, exe: &Path, name: &str, args: &[&str]) -> anyhow::Result<Command> {
        let mut command = self.launcher.command(exe, &format!("{name}.log"))?;
        command.args(args);
        Ok(command)
    }
}

impl Launcher {
    fn spawn(&self, proc: &mut Proc) -> anyhow::Result<()> {
        let mut command = self.command(&proc.exe, &format!("{}.log", proc.spec.name))?;
        command.args(&proc.spec.args);
        proc.child = Some(command.spawn().with_context(|| format!("starting {}", proc.spec.name))?);
        proc.restart_at = None;
        proc.starts += 1;
        Ok(())
    }

    fn command(&self, exe: &Path, log: &str) -> anyhow::Result<Command> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.logs.join(log))?;
        let mut command = Command::new(exe);
        command.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).kill_on_drop(true);
        for key in ["HERALD_TOPIC_PREFIX", "HERALD_FAULT", "HERALD_NOTIFY_URL", "HERALD_ARTIFACTS", "HERALD_API_TOKENS"] {
            command.env_remove(key);
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        Ok(command)
    }
}

impl Procs {
    /// Names of processes that are running now.
    pub fn running(&self) -> Vec<usize> {
        (0..self.procs.len()).filter(|i| self.procs[*i].child.is_some()).collect()
    }

    pub fn name(&self, i: usize) -> &str {
        &self.procs[i].spec.name
    }

    /// How many times process `i` was started (restarts after an exit included).
    pub fn starts(&self, i: usize) -> u32 {
        self.procs[i].starts
    }

    pub fn role(&self, i: usize) -> &'static str {
        self.procs[i].spec.role
    }

    /// Every process, running or not.
    pub fn all(&self) -> std::ops::Range<usize> {
        0..self.procs.len()
    }

    /// Stops process `i` as an operator would (SIGTERM, `grace` to drain,
    /// then SIGKILL), then starts it on `exe`. Returns how the old one exited.
    pub async fn replace(&mut self, i: usize, exe: &Path, grace: Duration) -> anyhow::Result<Option<i32>> {
        let proc = &mut self.procs[i];
        let exited = terminate(proc, grace).await;
        proc.exe = exe.to_owned();
        self.launcher.spawn(proc)?;
        Ok(exited)
    }

    /// SIGSTOPs (`freeze`) or SIGCONTs process `i`: work it holds stays held,
    /// work behind it piles up.
    pub async fn signal(&self, i: usize, signal: &str) -> anyhow::Result<()> {
        if let Some(pid) = self.procs[i].child.as_ref().and_then(Child::id) {
            Command::new("kill").args([signal, &pid.to_string()]).status().await?;
        }
        Ok(())
    }

    /// SIGKILLs process `i`, counted, and schedules its restart.
    pub async fn kill(&mut self, i: usize) -> anyhow::Result<()> {
        if self.kill_quietly(i).await? {
            *self.kills.entry(self.procs[i].spec.role).or_default() += 1;
        }
        Ok(())
    }

    async fn kill_quietly(&mut self, i: usize) -> anyhow::Result<bool> {
        let proc = &mut self.procs[i];
        let Some(mut child) = proc.child.take() else { return Ok(false) };
        child.start_kill()?;
        child.wait().await?;
        proc.restart_at = Some(Instant::now() + RESTART);
        Ok(true)
    }

    /// Notices processes that exited on their own, and restarts every
    /// process whose time has come.
    pub fn tick(&mut self) -> anyhow::Result<()> {
        let now = Instant::now();
        for i in 0..self.procs.len() {
            let proc = &mut self.procs[i];
            let exited = match proc.child.as_mut() {
                Some(child) => child.try_wait()?.is_some(),
                None => false,
            };
            if exited {
                proc.child = None;
                *self.exits.entry(proc.spec.role).or_default() += 1;
                proc.restart_at = Some(now + RESTART);
            }
            if self.procs[i].restart_at.is_some_and(|at| at <= now) {
                self.launcher.spawn(&mut self.procs[i])?;
            }
        }
        Ok(())
    }

    /// True when every process is running.
    pub fn all_up(&self) -> bool {
        self.procs.iter().all(|p| p.child.is_some())
    }

    /// Restarts every stopped process now (for the drain).
    pub fn restart_all_now(&mut self) {
        for proc in &mut self.procs {
            if proc.child.is_none() {
                proc.restart_at = Some(Instant::now());
            }
        }
    }

    /// Stops everything: SIGTERM, a grace period to drain, then SIGKILL.
    pub async fn stop_all(&mut self, grace: Duration) {
        for proc in &mut self.procs {
            if let Some(pid) = proc.child.as_ref().and_then(Child::id) {
                let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status().await;
            }
        }
        for proc in &mut self.procs {
            terminate(proc, grace).await;
            proc.restart_at = None;
        }
    }
}

/// SIGTERM (if still running; with SIGCONT, so a frozen process receives
/// it), then SIGKILL after `grace`. Returns the exit code, `None` when it was
/// not running or had to be killed.
async fn terminate(proc: &mut Proc, grace: Duration) -> Option<i32> {
    let mut child = proc.child.take()?;
    if let Some(pid) = child.id() {
        let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status().await;
        let _ = Command::new("kill").args(["-CONT", &pid.to_string()]).status().await;
    }
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status.ok().and_then(|s| s.code()),
        Err(_) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            None
        }
    }
}
