//! `herald.toml`: every setting that has a flag, in one file, for every
//! command. Precedence is flag > environment > file > default, which the
//! file gets by being turned into flags clap then parses as any other:
//! a key becomes `--key=value` unless the command line already gives that
//! flag or its `HERALD_*` variable is set. Clap's own parsers then check the
//! value, so a bad value fails exactly as the flag would, but named as the
//! file's key.
//!
//! A top-level key applies to every command that has the flag (one file for
//! all roles); a table named after a command (`[relay]`, `[inbox.cleanup]`)
//! applies to that command and its subcommands and wins over the top level.
//! Actions and safety overrides ([`ACTION_FLAGS`]) stay on the command line.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, ArgMatches, Command};
use thiserror::Error;

/// The variable naming the file when `--config` is not given.
pub const CONFIG_ENV: &str = "HERALD_CONFIG";

/// Flags that are not settings: help and the file itself, safety
/// overrides, and what a one-off command acts on (which rows a redrive
/// takes, which subscription a cleanup narrows to, whether a migrate or a
/// rebuild only looks) — an operator types each of these every time, so a
/// file written for one command can never widen or redirect another.
pub const ACTION_FLAGS: &[&str] = &[
    "help",
    "version",
    "config",
    "force",
    "resend",
    "mark-sent",
    "start-at",
    "notify-start-at",
    "seq",
    "key",
    "status",
    "subscription",
    "from-snapshot",
    "offline",
    "dry-run",
];

/// A configuration file that cannot be used: the binary exits 2.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read the configuration file {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path} is not valid TOML: {reason}")]
    Syntax { path: PathBuf, reason: String },
    #[error("{path}: unknown key `{key}` (not a setting of any herald command; see `herald help`)")]
    UnknownKey { path: PathBuf, key: String },
    #[error("{path}: `{key}` is an action or a safety override, not a setting: give --{key} on the command line")]
    Action { path: PathBuf, key: String },
    #[error("{path}: `{key}`: {reason}")]
    BadValue { path: PathBuf, key: String, reason: String },
}

/// Where a setting's effective value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env,
    File,
    Default,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Flag => "flag",
            Source::Env => "environment",
            Source::File => "file",
            Source::Default => "default",
        }
    }
}

/// A parsed `herald.toml`.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    pub path: PathBuf,
    table: toml::Table,
}

impl ConfigFile {
    pub fn load(path: &Path) -> Result<ConfigFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read { path: path.to_owned(), reason: e.to_string() })?;
        ConfigFile::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<ConfigFile, ConfigError> {
        let table = text.parse::<toml::Table>().map_err(|e| ConfigError::Syntax { path: path.to_owned(), reason: e.to_string() })?;
        Ok(ConfigFile { path: path.to_owned(), table })
    }
}

/// The command line with the file's settings added, and the flags the file
/// supplied (by clap id), for [`sources`].
#[derive(Debug, Clone)]
pub struct Resolved {
    pub argv: Vec<OsString>,
    pub from_file: BTreeMap<String, String>,
}

/// The file named by `--config` or `HERALD_CONFIG`, if any; a first,
/// forgiving parse finds it (the full parse comes after the file is in).
pub fn locate(command: &Command, argv: &[OsString]) -> Option<PathBuf> {
    let matches = command.clone().ignore_errors(true).try_get_matches_from(argv).ok()?;
    leaf(&matches).1.get_one::<PathBuf>("config").cloned()
}

/// `argv` with every setting of `file` that applies to the command it runs
/// and that neither a flag nor a variable already sets. Checks every key of
/// the file, including those for other commands.
pub fn resolve(command: &Command, argv: Vec<OsString>, file: &ConfigFile) -> Result<Resolved, ConfigError> {
    let mut built = command.clone();
    built.build();
    check_keys(&built, file)?;
    // The unbuilt tree: `ignore_errors` reaches subcommands only when set before the build.
    let Ok(first) = command.clone().ignore_errors(true).try_get_matches_from(&argv) else {
        // Help or version: nothing to add.
        return Ok(Resolved { argv, from_file: BTreeMap::new() });
    };
    let (path, matches) = leaf(&first);
    if path.first().is_some_and(|c| c == "config") {
        // `herald config show` resolves the file for the command line it
        // is given; its own line takes nothing from it.
        return Ok(Resolved { argv, from_file: BTreeMap::new() });
    }
    let target = find(&built, &path);
    let mut added = Vec::new();
    let mut from_file = BTreeMap::new();
    for arg in target.get_arguments().filter(|a| is_setting(a)) {
        let long = arg.get_long().unwrap_or_default();
        let Some(value) = lookup(&file.table, &path, long) else { continue };
        // A flag typed (or set by its variable) wins, also over a file
        // value that would conflict with it.
        if given(matches, arg) || target.get_arg_conflicts_with(arg).iter().any(|other| given(matches, other)) {
            continue;
        }
        let flags = as_flags(arg, value).map_err(|reason| bad_value(file, long, reason))?;
        from_file.insert(arg.get_id().to_string(), long.to_owned());
        added.extend(flags);
    }
    Ok(Resolved { argv: splice(argv, added), from_file })
}

/// The full parse, with a bad value the file gave named as the file's key.
pub fn parse(command: &Command, resolved: &Resolved, file: Option<&ConfigFile>) -> Result<ArgMatches, clap::Error> {
    command.clone().try_get_matches_from(&resolved.argv).map_err(|e| match (file, offending_flag(&e)) {
        (Some(file), Some(long)) if resolved.from_file.values().any(|k| *k == long) => {
            let reason = if secret_longs(command).contains(long.as_str()) {
                "refused (the value is a secret and is not shown)".to_owned()
            } else {
                e.render().to_string().lines().next().unwrap_or_default().trim_start_matches("error: ").to_owned()
            };
            clap::Error::raw(clap::error::ErrorKind::InvalidValue, format!("{}\n", bad_value(file, &long, reason)))
        }
        _ => e,
    })
}

/// One setting of a command as it will run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The flag's long name, which is also the file's key.
    pub key: String,
    /// `None`: not set, and no default.
    pub values: Option<Vec<String>>,
    pub source: Source,
    /// A secret: its value must be redacted when shown.
    pub secret: bool,
    /// A repeatable flag: a list in the file.
    pub list: bool,
}

/// Where each setting of the command `matches` ran came from.
pub fn sources(command: &Command, matches: &ArgMatches, resolved: &Resolved) -> Vec<Setting> {
    let mut built = command.clone();
    built.build();
    let (path, leaf_matches) = leaf(matches);
    let target = find(&built, &path);
    let mut out = Vec::new();
    for arg in target.get_arguments().filter(|a| is_setting(a)) {
        let id = arg.get_id().as_str();
        let source = match leaf_matches.value_source(id) {
            _ if resolved.from_file.contains_key(id) => Source::File,
            Some(clap::parser::ValueSource::CommandLine) => Source::Flag,
            Some(clap::parser::ValueSource::EnvVariable) => Source::Env,
            _ => Source::Default,
        };
        let values = leaf_matches.get_raw(id).map(|raw| raw.map(|v| v.to_string_lossy().into_owned()).collect::<Vec<_>>());
        out.push(Setting {
            key: arg.get_long().unwrap_or_default().to_owned(),
            values: values.filter(|v| !v.is_empty()),
            source,
            secret: arg.is_hide_env_values_set(),
            list: matches!(arg.get_action(), ArgAction::Append),
        });
    }
    out
}

/// Names of the subcommands of a parse, and the innermost matches.
fn leaf(matches: &ArgMatches) -> (Vec<String>, &ArgMatches) {
    let mut path = Vec::new();
    let mut at = matches;
    while let Some((name, sub)) = at.subcommand() {
        path.push(name.to_owned());
        at = sub;
    }
    (path, at)
}

fn find<'a>(command: &'a Command, path: &[String]) -> &'a Command {
    path.iter().fold(command, |at, name| at.find_subcommand(name).unwrap_or(at))
}

/// A flag in `--help` that is not an action. Hidden flags (fault injection
/// for crash tests) stay out of the file.
fn is_setting(arg: &Arg) -> bool {
    arg.get_long().is_some_and(|long| !ACTION_FLAGS.contains(&long)) && !arg.is_positional() && !arg.is_hide_set()
}

/// The innermost value for `long`: `[a.b] long`, then `[a] long`, then top level.
fn lookup<'a>(table: &'a toml::Table, path: &[String], long: &str) -> Option<&'a toml::Value> {
    for depth in (0..=path.len()).rev() {
        let mut at = Some(table);
        for name in &path[..depth] {
            at = at.and_then(|t| t.get(name)).and_then(toml::Value::as_table);
        }
        if let Some(value) = at.and_then(|t| t.get(long)).filter(|v| !v.is_table()) {
            return Some(value);
        }
    }
    None
}

/// Set by a flag, or by its variable (a variable set to nothing counts as unset).
fn given(matches: &ArgMatches, arg: &Arg) -> bool {
    let on_line = matches!(matches.value_source(arg.get_id().as_str()), Some(clap::parser::ValueSource::CommandLine));
    let in_env = arg.get_env().and_then(std::env::var_os).is_some_and(|v| !v.is_empty());
    on_line || in_env
}

/// One TOML value as the flags that say the same.
fn as_flags(arg: &Arg, value: &toml::Value) -> Result<Vec<OsString>, String> {
    let long = arg.get_long().unwrap_or_default();
    let is_switch = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
    match value {
        toml::Value::Boolean(on) if is_switch => Ok(if *on { vec![format!("--{long}").into()] } else { vec![] }),
        _ if is_switch => Err(format!("`{long}` is a switch: true or false")),
        toml::Value::Array(items) if matches!(arg.get_action(), ArgAction::Append) => {
            items.iter().map(|item| scalar(item).map(|v| format!("--{long}={v}").into())).collect()
        }
        toml::Value::Array(_) => Err(format!("`{long}` takes one value, not a list")),
        other => Ok(vec![format!("--{long}={}", scalar(other)?).into()]),
    }
}

fn scalar(value: &toml::Value) -> Result<String, String> {
    match value {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(n) => Ok(n.to_string()),
        toml::Value::Float(x) => Ok(x.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Datetime(d) => Ok(d.to_string()),
        toml::Value::Array(_) | toml::Value::Table(_) => Err("expected a single value".to_owned()),
    }
}

/// The added flags go before a `--`, if the command line has one.
fn splice(mut argv: Vec<OsString>, added: Vec<OsString>) -> Vec<OsString> {
    let at = argv.iter().position(|a| a == "--").unwrap_or(argv.len());
    argv.splice(at..at, added);
    argv
}

fn bad_value(file: &ConfigFile, key: &str, reason: String) -> ConfigError {
    ConfigError::BadValue { path: file.path.clone(), key: key.to_owned(), reason }
}

/// `--name` from a clap error about one argument (`--name <VALUE>`).
fn offending_flag(e: &clap::Error) -> Option<String> {
    let arg = e.get(clap::error::ContextKind::InvalidArg)?.to_string();
    let long = arg.strip_prefix("--")?;
    Some(long.split([' ', '=']).next().unwrap_or(long).to_owned())
}

/// Every key must be a setting of some command; every table a command.
fn check_keys(command: &Command, file: &ConfigFile) -> Result<(), ConfigError> {
    check_table(command, &file.table, file)
}

/// A table's keys must be settings of its command or of one below it.
fn check_table(command: &Command, table: &toml::Table, file: &ConfigFile) -> Result<(), ConfigError> {
    let known = longs_below(command);
    for (key, value) in table {
        match (value, command.find_subcommand(key)) {
            (toml::Value::Table(inner), Some(sub)) => check_table(sub, inner, file)?,
            _ if ACTION_FLAGS.contains(&key.as_str()) => return Err(ConfigError::Action { path: file.path.clone(), key: key.clone() }),
            (toml::Value::Table(_), None) => return Err(ConfigError::UnknownKey { path: file.path.clone(), key: key.clone() }),
            _ if !known.contains(key.as_str()) => return Err(ConfigError::UnknownKey { path: file.path.clone(), key: key.clone() }),
            _ => {}
        }
    }
    Ok(())
}

/// Flags whose values are secrets (their variables are hidden from `--help`).
fn secret_longs(command: &Command) -> BTreeSet<String> {
    let mut longs: BTreeSet<String> =
        command.get_arguments().filter(|a| a.is_hide_env_values_set()).filter_map(|a| a.get_long().map(str::to_owned)).collect();
    for sub in command.get_subcommands() {
        longs.extend(secret_longs(sub));
    }
    longs
}

/// The long flags of `command` and every command below it.
fn longs_below(command: &Command) -> BTreeSet<&str> {
    let mut longs: BTreeSet<&str> = command.get_arguments().filter(|a| !a.is_hide_set()).filter_map(Arg::get_long).collect();
    for sub in command.get_subcommands() {
        longs.extend(longs_below(sub));
    }
    longs
}

#[cfg(test)]
mod tests;
