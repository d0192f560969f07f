//! One node: a JVM running `kafka.Kafka` on its own storage directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

pub struct Node {
    id: usize,
    port: u16,
    dir: PathBuf,
    kafka_home: PathBuf,
    log4j: PathBuf,
    jvm_opts: String,
    child: Option<Child>,
    /// Times this node was started, the first start included.
    starts: u32,
}

impl Node {
    pub(crate) fn new(id: usize, port: u16, dir: PathBuf, kafka_home: &Path, log4j: &Path, jvm_opts: String) -> Node {
        Node { id, port, dir, kafka_home: kafka_home.to_owned(), log4j: log4j.to_owned(), jvm_opts, child: None, starts: 0 }
    }

    /// Kafka's `node.id`, 1-based.
    pub fn id(&self) -> usize {
        self.id
    }

    /// `127.0.0.1:<broker port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// Warnings and errors the node logged (Log4j), across restarts.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    fn java(&self) -> Command {
        let java = std::env::var_os("JAVA_HOME")
            .map(|home| PathBuf::from(home).join("bin/java"))
            .filter(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from("java"));
        let mut command = Command::new(java);
        command
            .args(self.jvm_opts.split_whitespace())
            .arg(format!("-Dkafka.logs.dir={}", self.dir.display()))
            .arg(format!("-Dlog4j2.configurationFile={}", self.log4j.display()))
            .arg("-cp")
            .arg(format!("{}/*", self.kafka_home.display()))
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        command
    }

    /// Starts the JVM in the background; output goes to `stdout.log`.
    pub(crate) fn spawn(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_none(), "node {} is already running", self.id);
        let out = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("stdout.log"))?;
        let child = self
            .java()
            .arg("kafka.Kafka")
            .arg("server.properties")
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting java (is a JDK 17+ installed?)")?;
        std::fs::write(self.dir.join("pid"), child.id().to_string())?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    /// SIGKILL, then reap. A node that is down already is left alone.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            child.wait().with_context(|| format!("reaping node {}", self.id))?;
        }
        Ok(())
    }

    /// SIGTERM (a controlled shutdown that hands leadership over), SIGKILL
    /// if it takes longer than `patience`.
    pub fn stop(&mut self, patience: Duration) -> anyhow::Result<()> {
        let Some(child) = self.child.as_mut() else { return Ok(()) };
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let deadline = Instant::now() + patience;
        while Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                self.child = None;
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.kill()
    }

    /// An error naming the node's output if it exited on its own.
    pub(crate) fn check_alive(&mut self) -> anyhow::Result<()> {
        let Some(child) = self.child.as_mut() else { return Ok(()) };
        if let Some(status) = child.try_wait()? {
            self.child = None;
            anyhow::bail!("node {} exited with {status}: {}", self.id, tail(&self.dir.join("stdout.log")));
        }
        Ok(())
    }
}

/// Formats every node's storage with one cluster id and the SASL_SSL
/// listener's SCRAM credential (`--add-scram` syntax), the nodes in
/// parallel (each is a JVM start).
pub(crate) fn format_storage(nodes: &[Node], cluster_id: &str, scram: &str) -> anyhow::Result<()> {
    let mut running = Vec::new();
    for node in nodes {
        let out = std::fs::File::create(node.dir.join("format.log"))?;
        let child = node
            .java()
            .args(["kafka.tools.StorageTool", "format", "--ignore-formatted", "-t", cluster_id, "-c", "server.properties"])
            .args(["--add-scram", scram])
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("running the storage tool (is a JDK 17+ installed?)")?;
        running.push((node, child));
    }
    for (node, mut child) in running {
        let status = child.wait()?;
        anyhow::ensure!(status.success(), "formatting node {} failed: {}", node.id, tail(&node.dir.join("format.log")));
    }
    Ok(())
}

/// True when a node under `dir` failed because its port was taken.
pub(crate) fn port_clash(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    entries.filter_map(Result::ok).any(|e| {
        ["stdout.log", "server.log"]
            .iter()
            .any(|log| std::fs::read_to_string(e.path().join(log)).is_ok_and(|s| s.contains("Address already in use")))
    })
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
