//! The rolling upgrade (issue 24) as CI runs it: `herald drill
//! --upgrade-from` with the newest release whose schema differs from this
//! checkout's, built by the test from git into its own cached target
//! directory. Every role starts on the old release; with outbox rows behind
//! frozen relays, completions behind frozen subscriptions, a provider call
//! under a frozen dispatcher's claim and a rebuild the old release left half
//! done, this build migrates and replaces the roles one at a time, rolls the
//! last step back, finishes the rebuild, drains and audits: nothing lost,
//! nothing applied twice, no duplicate notification.
//!
//! Releases are found in CHANGELOG.md (`## vX.Y.Z — title (commit)`): the
//! tag when the clone has it, the commit named there otherwise.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(repo()).args(args).output().expect("run git");
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Releases, newest first: (tag, the commit CHANGELOG.md names, or the tag
/// itself for the newest entry, written before its commit existed).
fn releases() -> Vec<(String, String)> {
    let changelog = std::fs::read_to_string(repo().join("CHANGELOG.md")).expect("CHANGELOG.md");
    changelog
        .lines()
        .filter_map(|line| {
            let heading = line.strip_prefix("## v")?;
            let tag = format!("v{}", heading.split_whitespace().next()?);
            let commit = heading.rsplit_once('(').and_then(|(_, c)| c.strip_suffix(')')).map_or_else(|| tag.clone(), str::to_owned);
            Some((tag, commit))
        })
        .collect()
}

/// The migration files a commit ships; `None` when this clone lacks it.
fn migrations_at(commit: &str) -> Option<String> {
    git(&["ls-tree", "-r", "--name-only", commit, "--", "migrations/"])
}

/// The migration files of this checkout (its working tree).
fn migrations_here() -> String {
    let mut files = Vec::new();
    for backend in std::fs::read_dir(repo().join("migrations")).expect("migrations/") {
        let backend = backend.expect("entry").path();
        for file in std::fs::read_dir(&backend).expect("backend dir") {
            let file = file.expect("entry").path();
            files.push(file.strip_prefix(repo()).expect("under the repo").display().to_string());
        }
    }
    files.sort();
    files.join("\n")
}

/// The newest release whose schema differs from this checkout's: (tag, commit).
fn previous_schema_release() -> (String, String) {
    let here = migrations_here();
    for (tag, commit) in releases() {
        let commit = git(&["rev-parse", "--verify", "-q", &format!("{tag}^{{commit}}")]).unwrap_or(commit);
        match migrations_at(&commit) {
            Some(migrations) if migrations != here => return (tag, commit),
            _ => {}
        }
    }
    panic!("no release in CHANGELOG.md ships a schema other than this checkout's")
}

/// Builds `herald` at `commit` (once per machine): sources from `git
/// archive`, a target directory of its own under the test suite's cache.
fn build(tag: &str, commit: &str) -> PathBuf {
    let cache = std::env::var_os("HERALD_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/herald"));
    let releases = cache.join("releases");
    let src = releases.join(format!("{tag}-{commit}"));
    if !src.join("Cargo.lock").exists() {
        let partial = releases.join(format!("{tag}-{commit}.partial"));
        let _ = std::fs::remove_dir_all(&partial);
        std::fs::create_dir_all(&partial).expect("release source dir");
        let archive = Command::new("sh")
            .arg("-c")
            .arg(format!("git -C '{}' archive {commit} | tar -x -C '{}'", repo().display(), partial.display()))
            .status()
            .expect("git archive");
        assert!(archive.success(), "git archive {commit}");
        std::fs::rename(&partial, &src).expect("release source in place");
    }
    // A target directory per release: the releases' crates share names and
    // versions, and `git archive` dates every file at its commit, so in a
    // shared directory cargo could take one release's artifacts for another's.
    let target = releases.join(format!("{tag}-{commit}-target"));
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--locked", "-p", "herald", "--bin", "herald"])
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("cargo build of the old release");
    assert!(out.status.success(), "building {tag} ({commit}):\n{}", String::from_utf8_lossy(&out.stderr));
    target.join("debug/herald")
}

fn drill(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .arg("drill")
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("HERALD_LOG")
        // Every test names its cluster (or none) itself.
        .env_remove("HERALD_KAFKA_HOME")
        .output()
        .expect("run herald drill");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// One upgrade drill at a time: each starts three brokers and a dozen processes.
static ONE_DRILL: Mutex<()> = Mutex::new(());

#[test]
fn a_rolling_upgrade_with_work_in_flight_and_a_rollback_stays_clean_postgres() {
    let server = std::env::var("HERALD_TEST_DATABASE_URL").expect("HERALD_TEST_DATABASE_URL is not set: run the tests with scripts/test");
    rolling_upgrade(&server);
}

/// Every role shares one SQLite file (the drill's), as they can on one machine.
#[test]
fn a_rolling_upgrade_with_work_in_flight_and_a_rollback_stays_clean_sqlite() {
    rolling_upgrade("sqlite:");
}

fn rolling_upgrade(database: &str) {
    let kafka_home = std::env::var("HERALD_KAFKA_HOME").expect("HERALD_KAFKA_HOME is not set: run the tests with scripts/test");
    let (tag, commit) = previous_schema_release();
    let _one = ONE_DRILL.lock().unwrap_or_else(|e| e.into_inner());
    let old = build(&tag, &commit);
    let old = old.display().to_string();
    let (code, stdout, stderr) = drill(&[
        "--upgrade-from",
        &old,
        "--database",
        database,
        "--kafka-home",
        &kafka_home,
        "--seconds",
        "40",
        "--rate",
        "6",
        "--provider",
        "slow-keyed",
        "--broker-kill-every",
        "1h",
        "--drain-timeout",
        "150s",
        "--json",
    ]);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    let upgrade = &report["upgrade"];
    let failed_checks: Vec<&Value> =
        report["audit"]["checks"].as_array().into_iter().flatten().filter(|c| c["violations"] != Value::Array(vec![])).collect();
    let summary = serde_json::json!({
        "settled": report["settled"], "progress": report["progress"], "violations": report["violations"],
        "failed_checks": failed_checks, "load": report["load"], "targets": report["targets"],
        "notification_duplicates": report["notification_duplicates"], "upgrade": upgrade,
    });
    let tail = &stderr[stderr.len().saturating_sub(3000)..];
    assert_eq!(code, Some(0), "{summary:#}\n{tail}");
    assert_eq!(report["passed"], true);
    assert_eq!((report["settled"].as_bool(), report["violations"].as_u64()), (Some(true), Some(0)), "{:#}", report["audit"]);
    assert_eq!(report["notification_duplicates"], 0);

    assert_eq!(upgrade["migrate_exit"], 0, "{upgrade:#}");
    assert!(upgrade["schema_after"].as_i64() > upgrade["schema_before"].as_i64(), "{tag} has an older schema: {upgrade:#}");
    let in_flight = &upgrade["in_flight"];
    for held in ["pending_outbox", "unconsumed", "calls_under_claim", "rebuilds_building"] {
        assert!(in_flight[held].as_i64() > Some(0), "{held} in flight at the migration: {in_flight:#}");
    }
    let steps = upgrade["steps"].as_array().expect("steps");
    let to_new: Vec<&str> = steps.iter().filter(|s| s["to"] == "new").filter_map(|s| s["process"].as_str()).collect();
    for role in ["api", "worker-1", "relay-1", "relay-2", "consume-search", "consume-stats", "consume-notify", "dispatch-1"] {
        assert!(to_new.contains(&role), "{role} was upgraded: {to_new:?}");
    }
    let restarted = upgrade["restarted_after_step"].as_array().expect("restarted_after_step");
    assert!(restarted.is_empty(), "every process stayed up on the binary its step gave it (a refused schema exits 2): {restarted:?}");
    let rollback = steps.last().expect("a rollback step");
    assert_eq!((&rollback["to"], &rollback["process"]), (&Value::from("old"), &upgrade["rolled_back"]), "{steps:#?}");

    let rebuild = &upgrade["rebuild"];
    assert_eq!(rebuild["interrupted_state"], "building", "the old release left the rebuild half done: {rebuild:#}");
    assert_eq!(rebuild["resume_exit"], 0, "{rebuild:#}");
    let resumed = &rebuild["resume_report"];
    assert_eq!((&resumed["resumed"], &resumed["switched"]), (&Value::Bool(true), &Value::Bool(true)), "{rebuild:#}");
    assert_eq!(rebuild["active_after"], rebuild["generation"], "reads switched to the resumed generation: {rebuild:#}");
}

#[test]
fn an_upgrade_drill_from_a_binary_that_is_not_there_is_a_usage_error() {
    let (code, _, stderr) =
        drill(&["--upgrade-from", "/nonexistent/herald", "--database", "postgres://127.0.0.1:1/x", "--brokers", "127.0.0.1:1"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--upgrade-from /nonexistent/herald"), "{stderr}");
}

#[test]
fn the_release_found_ships_another_schema_and_is_in_the_changelog() {
    let (tag, commit) = previous_schema_release();
    assert_ne!(migrations_at(&commit).as_deref(), Some(migrations_here().as_str()), "{tag}");
    assert!(releases().iter().any(|(t, _)| *t == tag), "{tag}");
}
