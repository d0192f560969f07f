//! `herald schemas check`: every version of every event schema against its
//! predecessors, under the mode `compatibility.toml` declares. CI runs it
//! (scripts/test) so an incompatible schema is refused before it ships.
//!
//! Exit codes: 0 all good, 1 violations (listed on stdout), 2 bad input
//! (missing directory, unreadable or unparsable file).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use herald_envelope::compat::{self, COMPATIBILITY_FILE};

#[derive(Debug, Clone, Args)]
pub struct SchemasArgs {
    #[command(subcommand)]
    pub command: SchemasCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum SchemasCommand {
    /// Check schema evolution; exit 1 listing each incompatibility.
    Check {
        /// Directory of `<subject>.v<N>.avsc` files and `compatibility.toml`.
        #[arg(long, default_value = "schemas")]
        dir: PathBuf,
    },
}

pub async fn run(args: SchemasArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        SchemasCommand::Check { dir } => Ok(check(&dir)),
    }
}

/// Runs the check on `dir`, printing the verdict.
pub fn check(dir: &Path) -> ExitCode {
    let (files, compatibility) = match read_dir(dir) {
        Ok(read) => read,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let report = match compat::check(&files, &compatibility) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {}: {e}", dir.display());
            return ExitCode::from(2);
        }
    };
    for s in &report.subjects {
        let versions: Vec<String> = s.versions.iter().map(|v| format!("v{v}")).collect();
        println!("{}: {} ({})", s.name, versions.join(", "), s.mode);
    }
    if report.violations.is_empty() {
        println!("ok: {} subject(s), every version compatible under its mode", report.subjects.len());
        return ExitCode::SUCCESS;
    }
    for v in &report.violations {
        println!("violation: {v}");
    }
    println!("{} violation(s) in {}", report.violations.len(), dir.display());
    ExitCode::from(1)
}

/// The `.avsc` files of `dir` (name, text) and the compatibility file's text.
/// A missing compatibility file is bad input, not "everything default": a
/// directory without it is most likely the wrong directory.
fn read_dir(dir: &Path) -> Result<(Vec<(String, String)>, String), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("schema directory {}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        if name.ends_with(".avsc") {
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            files.push((name, text));
        }
    }
    files.sort();
    let compat_path = dir.join(COMPATIBILITY_FILE);
    let compatibility = std::fs::read_to_string(&compat_path).map_err(|e| format!("{}: {e}", compat_path.display()))?;
    Ok((files, compatibility))
}
