//! `herald config show [COMMAND…]`: the configuration a command line would
//! run with, each setting with its value (secrets redacted) and where it
//! came from (flag, environment, file, default), in the file's own syntax
//! so a line can be pasted into `herald.toml`.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::process::ExitCode;

use clap::{Args, Command, Subcommand};
use herald_secret::SecretUrl;

use crate::config_file::{self, ConfigFile, Resolved, Setting};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_property_keeps_its_key_even_when_its_value_holds_a_url() {
        assert_eq!(redact("sasl.oauthbearer.config=clientSecret=abc tokenEndpoint=https://x"), "sasl.oauthbearer.config=<redacted>");
        assert!(!redact("postgres://u:pw@h/db?sslmode=require").contains("pw"));
        assert_eq!(redact("hunter2"), "<redacted>");
    }

    #[test]
    fn only_numbers_toml_reads_back_the_same_are_bare() {
        for bare in ["0", "42", "0.5", "true"] {
            assert_eq!(toml_literal(bare), bare);
        }
        for quoted in ["007", ".5", "1.", "1e3", "+5", "24h"] {
            assert_eq!(toml_literal(quoted), format!("\"{quoted}\""));
        }
    }
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub command: ConfigCommand,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the effective configuration of a command (default `serve`) and where each value came from.
    Show {
        /// The command line to resolve, as you would run it: `relay`, `consume search --batch 500`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        command: Vec<String>,
    },
}

/// Runs `herald config …` against the command tree `cli` of the binary.
pub fn run(cli: &Command, file: Option<&ConfigFile>, args: ConfigArgs) -> ExitCode {
    let ConfigCommand::Show { command } = args.command;
    match show(cli, file, &command) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

/// The text `herald config show` prints for `words` (a herald command line
/// without the program name; empty means `serve`).
pub fn show(cli: &Command, file: Option<&ConfigFile>, words: &[String]) -> Result<String, String> {
    let words: Vec<&str> = if words.is_empty() { vec!["serve"] } else { words.iter().map(String::as_str).collect() };
    let argv: Vec<OsString> = std::iter::once("herald").chain(words.iter().copied()).map(OsString::from).collect();
    // `herald config show relay --config other.toml` shows other.toml.
    let named = config_file::locate(cli, &argv).map(|path| ConfigFile::load(&path)).transpose().map_err(|e| e.to_string())?;
    let file = named.as_ref().or(file);
    let resolved = match file {
        Some(file) => config_file::resolve(cli, argv, file).map_err(|e| e.to_string())?,
        None => Resolved { argv, from_file: Default::default() },
    };
    let matches =
        config_file::parse(cli, &resolved, file).map_err(|e| e.render().to_string().trim_end().trim_start_matches("error: ").to_owned())?;
    let mut out = String::new();
    let origin = file.map_or_else(|| "no configuration file".to_owned(), |f| format!("configuration file {}", f.path.display()));
    let _ = writeln!(out, "# herald {} ({origin}; precedence: flag > environment > file > default)", words.join(" "));
    for setting in config_file::sources(cli, &matches, &resolved) {
        match &setting.values {
            Some(values) => {
                let _ = writeln!(out, "{} = {}  # {}", setting.key, literal(&setting, values), setting.source.as_str());
            }
            None => {
                let _ = writeln!(out, "# {} (not set)", setting.key);
            }
        }
    }
    Ok(out)
}

/// The value as the file would hold it: a list for a repeatable flag.
fn literal(setting: &Setting, values: &[String]) -> String {
    let shown: Vec<String> = values.iter().map(|v| if setting.secret { redact(v) } else { v.clone() }).map(|v| toml_literal(&v)).collect();
    if setting.list { format!("[{}]", shown.join(", ")) } else { shown.join(",") }
}

/// `KEY=VALUE` properties keep their key, URLs all but their password;
/// other secrets show nothing. A property is told apart first: its value
/// may itself hold a URL after a secret.
fn redact(value: &str) -> String {
    match value.split_once('=') {
        Some((key, _)) if !key.contains("://") => format!("{key}=<redacted>"),
        _ if value.contains("://") => SecretUrl::new(value).redacted().to_owned(),
        _ => "<redacted>".to_owned(),
    }
}

/// Switches and numbers as themselves, everything else as a TOML string.
fn toml_literal(value: &str) -> String {
    // Only what TOML reads back as the same text: no leading zeros, signs
    // or exponents.
    let plain_number = |v: &str| {
        let digits = v.split_once('.').map_or((v, None), |(i, f)| (i, Some(f)));
        let int_ok =
            !digits.0.is_empty() && digits.0.bytes().all(|b| b.is_ascii_digit()) && (digits.0 == "0" || !digits.0.starts_with('0'));
        int_ok && digits.1.is_none_or(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))
    };
    let bare = matches!(value, "true" | "false") || plain_number(value);
    if bare { value.to_owned() } else { toml::Value::String(value.to_owned()).to_string() }
}
