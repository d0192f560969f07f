//! The drill's broker: a command the drill starts, stops once and starts
//! again, in a directory of its own so its storage survives the restart.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::process::{Child, Command};

pub struct Broker {
    command: String,
    dir: PathBuf,
    pub port: u16,
    child: Option<Child>,
    pub stops: u64,
    /// Relays restarted when the broker came back (see `bring_broker_back`).
    pub relays_restarted: u64,
}

/// The command line for a tansu binary, as `scripts/test` starts it: SQLite
/// storage in the working directory, advertised on loopback.
pub fn tansu_command(bin: &str) -> String {
    format!(
        "'{bin}' broker --listener-url tcp://127.0.0.1:{{port}} --advertised-listener-url tcp://127.0.0.1:{{port}} --storage-engine sqlite://tansu.db"
    )
}

impl Broker {
    /// `command` is run by `sh` in `dir` with `{port}` replaced.
    pub fn new(command: &str, dir: &Path, port: u16) -> anyhow::Result<Broker> {
        std::fs::create_dir_all(dir)?;
        // tansu reads a .env from its working directory or any parent: an
        // empty one of its own keeps stray settings out.
        std::fs::write(dir.join(".env"), "")?;
        Ok(Broker { command: command.replace("{port}", &port.to_string()), dir: dir.to_owned(), port, child: None, stops: 0, relays_restarted: 0 })
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts the broker and waits until it accepts connections.
    pub async fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("broker.log"))?;
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {}", self.command))
            .current_dir(&self.dir)
            .env("RUST_LOG", std::env::var("HERALD_TANSU_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting the broker: {}", self.command))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while tokio::net::TcpStream::connect(self.address()).await.is_err() {
            let exited = match self.child.as_mut() {
                Some(child) => child.try_wait()?,
                None => None,
            };
            if let Some(status) = exited {
                anyhow::bail!("the broker exited with {status} during start; see {}", self.dir.join("broker.log").display());
            }
            anyhow::ensure!(Instant::now() < deadline, "the broker did not accept connections within 60s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Stops the broker during the drill, counted.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.terminate().await?;
        self.stops += 1;
        Ok(())
    }

    /// Stops the broker as an operator would (SIGTERM, SIGKILL after 10 s).
    pub async fn terminate(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else { return Ok(()) };
        if let Some(pid) = child.id() {
            Command::new("kill").args(["-TERM", &pid.to_string()]).status().await?;
        }
        if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err() {
            child.start_kill()?;
            child.wait().await?;
        }
        Ok(())
    }
}
