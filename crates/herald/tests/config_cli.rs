//! `herald.toml` through the binary: precedence flag > environment > file >
//! default as `herald config show` reports it, secrets redacted, and a bad
//! file stopping a command with exit 2 before it does anything.

use std::path::Path;
use std::process::{Command, Output};

fn herald(args: &[&str], config: &Path, env: &[(&str, &str)]) -> anyhow::Result<Output> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_herald"));
    command.args(args).env("HERALD_CONFIG", config).env_remove("HERALD_DATABASE_URL").env_remove("HERALD_KAFKA_BROKERS");
    command.env_remove("HERALD_RELAY_LEASE_MS").env_remove("HERALD_RELAY_BATCH");
    for (key, value) in env {
        command.env(key, value);
    }
    Ok(command.output()?)
}

fn write(dir: &Path, text: &str) -> anyhow::Result<std::path::PathBuf> {
    let path = dir.join("herald.toml");
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The line of `config show` for `key`.
fn line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines().find(|l| l.starts_with(&format!("{key} = "))).unwrap_or_else(|| panic!("no `{key}` in\n{out}"))
}

#[test]
fn show_reports_each_value_and_where_it_came_from() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = write(
        dir.path(),
        "database = \"postgres://herald:hunter2@db.example/herald\"\nkafka = \"file:9092\"\n\
         kafka-property = [\"sasl.password=hunter3\"]\n[relay]\nlease-ms = 5000\nbatch-size = 10\n",
    )?;
    let out = herald(&["config", "show", "relay", "--batch-size", "7"], &config, &[("HERALD_KAFKA_BROKERS", "env:9092")])?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout)?;
    assert_eq!(line(&text, "batch-size"), "batch-size = 7  # flag");
    assert_eq!(line(&text, "kafka"), "kafka = \"env:9092\"  # environment");
    assert_eq!(line(&text, "lease-ms"), "lease-ms = 5000  # file");
    assert_eq!(line(&text, "max-attempts"), "max-attempts = 10  # default");
    assert!(line(&text, "database").contains("file") && !text.contains("hunter2"), "{text}");
    assert!(line(&text, "kafka-property").contains("sasl.password=") && !text.contains("hunter3"), "{text}");
    Ok(())
}

#[test]
fn a_bad_file_stops_the_command_with_exit_2_naming_the_key() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    for (text, expect) in [
        ("lease-msec = 1\n", "unknown key `lease-msec`"),
        ("[relay]\nlease-ms = \"soon\"\n", "`lease-ms`: invalid value"),
        ("[prune]\nforce = true\n", "`force` is an action"),
        ("[dlq]\nsubscription = \"search\"\n", "`subscription` is an action"),
        ("lease-ms = \n", "not valid TOML"),
    ] {
        let config = write(dir.path(), text)?;
        // The database does not exist: a command that got past the file
        // would fail differently (exit 1, naming the database).
        let out = herald(&["relay", "--database", "sqlite:///nonexistent/dir/x.db", "--kafka", "127.0.0.1:1"], &config, &[])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {stderr}");
        assert!(stderr.contains(expect) && stderr.contains("herald.toml"), "{text}: {stderr}");
    }
    let out = herald(&["relay"], &dir.path().join("missing.toml"), &[])?;
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
    Ok(())
}
