//! The configuration file against the real command tree: every setting
//! flag of every command can be set in `herald.toml`, the actions cannot,
//! and README's example loads.

use std::path::Path;

use clap::{Arg, ArgAction, Command};
use herald::config_file::{self, ACTION_FLAGS, ConfigError, ConfigFile};

use super::*;

/// Every command path of the tree, the root's included.
fn commands(command: &Command, path: Vec<String>, out: &mut Vec<(Vec<String>, Command)>) {
    out.push((path.clone(), command.clone()));
    for sub in command.get_subcommands() {
        let mut below = path.clone();
        below.push(sub.get_name().to_owned());
        commands(sub, below, out);
    }
}

fn tree() -> Vec<(Vec<String>, Command)> {
    let mut built = Cli::command();
    built.build();
    let mut out = Vec::new();
    commands(&built, Vec::new(), &mut out);
    out
}

/// A value the flag's own parser accepts: its default, one of its choices, else the
/// first of the shapes herald's flags take (numbers, a duration, a kind,
/// `KEY=VALUE`, an address, a URL, a time, a word).
fn sample(command: &Command, arg: &Arg) -> toml::Value {
    if matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse) {
        return toml::Value::Boolean(true);
    }
    let shapes = ["1", "5000", "0.5", "90s", "none", "outbox", "k=v", "127.0.0.1:1", "postgres://u@h/db", "2026-01-01T00:00:00Z", "x"];
    // Refused by the flag itself, not for another missing one.
    let accepted = |v: &&str| match command
        .clone()
        .try_get_matches_from(["herald".to_owned(), format!("--{}={v}", arg.get_long().unwrap_or_default())])
    {
        Ok(_) => true,
        Err(e) => !matches!(e.kind(), clap::error::ErrorKind::InvalidValue | clap::error::ErrorKind::ValueValidation),
    };
    let default = arg.get_default_values().first().map(|v| v.to_string_lossy().into_owned());
    let value = match (default, arg.get_possible_values().first()) {
        (Some(default), _) => default,
        (None, Some(choice)) => choice.get_name().to_owned(),
        (None, None) => shapes
            .iter()
            .find(|v| accepted(v))
            .unwrap_or_else(|| panic!("no sample value for --{} of {}", arg.get_id(), command.get_name()))
            .to_string(),
    };
    if matches!(arg.get_action(), ArgAction::Append) { toml::Value::Array(vec![value.into()]) } else { toml::Value::String(value) }
}

fn file_with(path: &[String], key: &str, value: toml::Value) -> ConfigFile {
    let mut table = toml::Table::new();
    table.insert(key.to_owned(), value);
    for name in path.iter().rev() {
        let mut outer = toml::Table::new();
        outer.insert(name.clone(), toml::Value::Table(table));
        table = outer;
    }
    ConfigFile::parse(Path::new("herald.toml"), &table.to_string()).expect("a table writes valid TOML")
}

#[test]
fn every_setting_flag_of_every_command_is_settable_in_the_file() {
    let cli = Cli::command();
    let mut checked = 0;
    // `herald config show` takes nothing from the file for its own line: it
    // resolves the file for the command line it shows.
    for (path, command) in tree().into_iter().filter(|(path, _)| path.first().is_none_or(|c| c != "config")) {
        // What `--help` shows: hidden flags (fault injection) are not settings.
        for arg in command.get_arguments().filter(|a| !a.is_positional() && !a.is_hide_set()) {
            let Some(long) = arg.get_long() else { continue };
            if ACTION_FLAGS.contains(&long) {
                continue;
            }
            let file = file_with(&path, long, sample(&command, arg));
            let argv: Vec<OsString> = std::iter::once("herald".to_owned()).chain(path.iter().cloned()).map(OsString::from).collect();
            let resolved = config_file::resolve(&cli, argv, &file).unwrap_or_else(|e| panic!("{path:?} --{long}: {e}"));
            // Required arguments of the command are not the point: the
            // forgiving parse shows where the file's value landed.
            let matches = cli.clone().ignore_errors(true).try_get_matches_from(&resolved.argv).expect("parses");
            let mut leaf = &matches;
            while let Some((_, sub)) = leaf.subcommand() {
                leaf = sub;
            }
            let given = leaf.get_raw(arg.get_id().as_str()).map(|v| v.count()).unwrap_or(0);
            let from_file = resolved.from_file.get(arg.get_id().as_str()).map(String::as_str);
            // A variable set here (CI sets some) wins over the file, for its
            // own flag and for the flags that conflict with it.
            let env_set = |a: &Arg| a.get_env().and_then(std::env::var_os).is_some_and(|v| !v.is_empty());
            if !env_set(arg) && !command.get_arg_conflicts_with(arg).into_iter().any(env_set) {
                assert_eq!(from_file, Some(long), "herald {} --{long} is not taken from the file", path.join(" "));
                assert!(given > 0, "herald {} --{long}: the file's value did not reach the flag", path.join(" "));
            }
            checked += 1;
        }
    }
    assert!(checked > 100, "only {checked} settings walked: the tree walk is broken");
}

#[test]
fn action_flags_are_refused_in_the_file_wherever_they_appear() {
    let cli = Cli::command();
    let mut refused = 0;
    for (path, command) in tree() {
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long().filter(|l| ACTION_FLAGS.contains(l) && !["help", "version"].contains(l)) else { continue };
            let file = file_with(&path, long, sample(&command, arg));
            let argv = vec![OsString::from("herald")];
            let err = config_file::resolve(&cli, argv, &file).expect_err("an action in the file");
            assert!(matches!(&err, ConfigError::Action { key, .. } if key == long), "{path:?}: {err}");
            refused += 1;
        }
    }
    for long in ["force", "resend", "mark-sent", "start-at", "config"] {
        assert!(tree().iter().any(|(_, c)| c.get_arguments().any(|a| a.get_long() == Some(long))), "--{long} no longer exists");
    }
    assert!(refused >= 5, "{refused}");
}

/// README's commented example is a file herald accepts, and its values reach
/// the commands it names.
#[test]
fn the_readme_example_loads() {
    let readme = include_str!("../../../README.md");
    let start = readme.find("```toml\n# herald.toml").expect("README has the herald.toml example") + "```toml\n".len();
    let text = &readme[start..start + readme[start..].find("```").expect("the example ends")];
    let file = ConfigFile::parse(Path::new("README.md"), text).expect("the example is TOML");
    let cli = Cli::command();
    for words in [&["serve"][..], &["relay"], &["consume", "search"], &["prune"]] {
        let argv: Vec<OsString> = std::iter::once("herald").chain(words.iter().copied()).map(OsString::from).collect();
        let resolved = config_file::resolve(&cli, argv, &file).unwrap_or_else(|e| panic!("{words:?}: {e}"));
        assert!(!resolved.from_file.is_empty(), "{words:?}: the example sets nothing for it");
    }
}
