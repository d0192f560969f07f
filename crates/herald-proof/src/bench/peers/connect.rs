//! Debezium as its users run it: Kafka Connect standalone with the
//! PostgreSQL connector and the outbox EventRouter, one JVM, from the jars
//! `scripts/bench-peers` fetched (`HERALD_DEBEZIUM_HOME`).
//!
//! Every setting that is not Connect's or Debezium's default is written in
//! [`worker`] and [`connector`], and printed with the results.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context;
use tokio::process::{Child, Command};

/// The JVM's heap, pinned as Kafka's `connect-standalone.sh` pins it.
pub(super) const HEAP: &str = "-Xms256m -Xmx2g";

/// Where the connector reads: the scratch database and the slot and
/// publication made before the backlog was written.
pub(super) struct Source {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub dbname: String,
    pub slot: String,
    pub publication: String,
}

impl Source {
    pub fn from_url(url: &str, slot: &str) -> anyhow::Result<Source> {
        let url = url::Url::parse(url)?;
        Ok(Source {
            host: url.host_str().context("no host in the database URL")?.to_owned(),
            port: url.port().unwrap_or(5432),
            user: if url.username().is_empty() { "postgres".to_owned() } else { url.username().to_owned() },
            // Connect wants one even where the server trusts the address.
            password: url.password().unwrap_or("postgres").to_owned(),
            dbname: url.path().trim_start_matches('/').to_owned(),
            slot: slot.to_owned(),
            publication: slot.to_owned(),
        })
    }
}

/// Connect's worker: the broker, String converters (the router's value is
/// the payload column as it is), and the producer settings that make its
/// writes as safe as the relay's (idempotent, `acks=all`).
pub(super) fn worker(bootstrap: &str, dir: &Path, rest_port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("bootstrap.servers", bootstrap.to_owned()),
        ("key.converter", "org.apache.kafka.connect.storage.StringConverter".to_owned()),
        ("value.converter", "org.apache.kafka.connect.storage.StringConverter".to_owned()),
        ("offset.storage.file.filename", dir.join("offsets").display().to_string()),
        ("listeners", format!("http://127.0.0.1:{rest_port}")),
        ("producer.enable.idempotence", "true".to_owned()),
        ("producer.acks", "all".to_owned()),
    ]
}

/// The connector: pgoutput from the slot and publication made before the
/// backlog, no snapshot (the backlog is in the WAL), the outbox table only,
/// and the EventRouter sending every event to `topic` keyed by
/// `aggregateid`.
pub(super) fn connector(source: &Source, topic: &str) -> Vec<(&'static str, String)> {
    vec![
        ("name", "herald-bench-debezium".to_owned()),
        ("connector.class", "io.debezium.connector.postgresql.PostgresConnector".to_owned()),
        ("tasks.max", "1".to_owned()),
        ("database.hostname", source.host.clone()),
        ("database.port", source.port.to_string()),
        ("database.user", source.user.clone()),
        ("database.password", source.password.clone()),
        ("database.dbname", source.dbname.clone()),
        ("topic.prefix", "herald-bench".to_owned()),
        ("plugin.name", "pgoutput".to_owned()),
        ("slot.name", source.slot.clone()),
        ("publication.name", source.publication.clone()),
        ("publication.autocreate.mode", "disabled".to_owned()),
        ("snapshot.mode", "no_data".to_owned()),
        ("table.include.list", "public.debezium_outbox".to_owned()),
        ("tombstones.on.delete", "false".to_owned()),
        ("transforms", "outbox".to_owned()),
        ("transforms.outbox.type", "io.debezium.transforms.outbox.EventRouter".to_owned()),
        ("transforms.outbox.route.topic.replacement", topic.to_owned()),
    ]
}

/// The settings as `key=value` lines; the password is not printed.
pub(super) fn describe(settings: &[(&'static str, String)]) -> Vec<String> {
    settings
        .iter()
        .filter(|(k, _)| !matches!(*k, "database.password" | "offset.storage.file.filename" | "listeners"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

fn write(path: &Path, settings: &[(&'static str, String)]) -> anyhow::Result<()> {
    let text: String = settings.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Starts Connect standalone in `dir` (its properties and its log there).
pub(super) fn start(
    home: &Path,
    dir: &Path,
    worker: &[(&'static str, String)],
    connector: &[(&'static str, String)],
) -> anyhow::Result<Child> {
    let (worker_file, connector_file) = (dir.join("worker.properties"), dir.join("connector.properties"));
    write(&worker_file, worker)?;
    write(&connector_file, connector)?;
    let log4j = dir.join("log4j2.properties");
    std::fs::write(
        &log4j,
        "rootLogger.level=info\nrootLogger.appenderRef.file.ref=file\nappender.file.type=File\nappender.file.name=file\n\
         appender.file.fileName=connect.log\nappender.file.layout.type=PatternLayout\nappender.file.layout.pattern=%d %p %c: %m%n\n",
    )?;
    let java = std::env::var_os("JAVA_HOME").map_or_else(|| PathBuf::from("java"), |home| PathBuf::from(home).join("bin/java"));
    Command::new(java)
        .args(HEAP.split(' '))
        .arg(format!("-Dlog4j2.configurationFile={}", log4j.display()))
        .arg("-cp")
        .arg(format!("{}/*", home.display()))
        .arg("org.apache.kafka.connect.cli.ConnectStandalone")
        .arg(&worker_file)
        .arg(&connector_file)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("connect.stderr"))?)
        .kill_on_drop(true)
        .spawn()
        .context("starting Kafka Connect (java)")
}
