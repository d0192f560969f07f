//! `herald rebuild search` as a real process, SIGKILLed at random points of
//! its replay and rerun until it finishes: it resumes from its stored
//! positions and ends with the same generation, with no duplicate effect.

use std::process::Stdio;
use std::time::Duration;

use herald::pipeline::{self, RoleOptions, Roles, Wiring};
use herald_api::Tokens;
use herald_export::{ExportRequest, Format, IntakeConfig, jobs};
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_projections::search;
use herald_rebuild::verify;
use herald_store::Db;
use herald_testkit::unique;
use serde_json::Value;
use sqlx::Row;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const EXPORTS: i64 = 24;

#[tokio::test(flavor = "multi_thread")]
async fn killed_rebuild_resumes_to_the_same_generation() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let prefix = unique("rb");
    let topics = Topics::with_prefix(&prefix);
    let kafka = EmbeddedKafka::start(1, &topics.all(), 3)?;
    let artifacts = tempfile::tempdir()?;
    let wiring = Wiring {
        db: db.clone(),
        kafka: KafkaConfig::new(kafka.bootstrap_servers()),
        topics: topics.clone(),
        group_prefix: unique("herald"),
        artifacts: artifacts.path().display().to_string(),
        tokens: Tokens::single("t", "alice"),
    };
    let roles = Roles { api: None, relay: true, worker: true, subscriptions: true, dispatcher: false };
    let running = pipeline::start_roles(wiring.clone(), roles, RoleOptions::default()).await?;
    let intake = IntakeConfig::new(topics.clone());
    for i in 0..EXPORTS {
        let request = ExportRequest { format: Format::Csv, query: format!("kill {i}") };
        jobs::submit(&db, &intake, "alice", &format!("k{i}"), &request).await?;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while search::count_active(&db).await? < EXPORTS {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "live search never caught up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let args = |extra: &[&str]| {
        let mut all = vec![
            "rebuild",
            "--database",
            &test_db.url,
            "--kafka",
            kafka.bootstrap_servers(),
            "--topic-prefix",
            &prefix,
            "--group-prefix",
            &wiring.group_prefix,
        ];
        all.extend_from_slice(extra);
        all.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let mut kills = 0;
    let report = loop {
        let mut child = Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(args(&["search", "--batch", "3", "--switch", "manual"]))
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let kill_after = if kills < 4 { fastrand::usize(1..=3) } else { usize::MAX };
        let mut progress_lines = 0;
        let mut report = None;
        while let Some(line) = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await?? {
            if line.starts_with("rebuild: replayed") {
                progress_lines += 1;
                if progress_lines == kill_after {
                    child.start_kill()?; // SIGKILL mid-replay
                    kills += 1;
                    break;
                }
            } else if line.starts_with('{') {
                report = Some(serde_json::from_str::<Value>(&line)?);
            }
        }
        let status = child.wait().await?;
        if let Some(report) = report {
            assert!(status.success());
            break report;
        }
    };
    assert!(kills >= 1, "the replay was interrupted at least once");
    assert_eq!(report["generation"], 2);
    assert_eq!(report["state"], "ready", "{report}");
    let (one, two) = verify::fingerprints(&db, &herald_rebuild::Search, 1, 2).await?;
    assert_eq!(one, two, "the resumed generation equals the live one");
    assert_eq!(two.rows, EXPORTS);
    let scope_rows: i64 =
        sqlx::query("SELECT COUNT(*) AS n FROM inbox WHERE subscription = 'search@g2'").fetch_one(db.pool()).await?.try_get("n")?;
    assert_eq!(scope_rows, 0, "search's writes are idempotent: its replay keeps no dedup rows");

    // Stats through the same engine: counters are not idempotent, so its
    // replay keeps its own dedup scope, one row per event it replays — all
    // of them once live stats has applied them all (the boundary is where
    // live stands; anything later would be live traffic's).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while herald_projections::stats::total_exports(&db).await? < EXPORTS {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "live stats never caught up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = Command::new(env!("CARGO_BIN_EXE_herald")).args(args(&["stats", "--json"])).output().await?;
    assert!(stats.status.success(), "{}", String::from_utf8_lossy(&stats.stderr));
    let last = String::from_utf8_lossy(&stats.stdout).lines().last().map(str::to_owned).unwrap_or_default();
    let stats_report: Value = serde_json::from_str(&last)?;
    assert_eq!(
        (stats_report["report"]["state"].as_str(), stats_report["report"]["switched"].as_bool()),
        (Some("active"), Some(true)),
        "{stats_report}"
    );
    let (one, two) = verify::fingerprints(&db, &herald_rebuild::Stats, 1, 2).await?;
    assert_eq!(one, two, "the rebuilt counters equal the live ones");
    let scope_rows: i64 =
        sqlx::query("SELECT COUNT(*) AS n FROM inbox WHERE subscription = 'stats@g2'").fetch_one(db.pool()).await?.try_get("n")?;
    assert_eq!(scope_rows, EXPORTS, "each completion once in the stats replay's own dedup scope");
    let rollback = Command::new(env!("CARGO_BIN_EXE_herald")).args(args(&["rollback", "stats"])).output().await?;
    assert!(String::from_utf8_lossy(&rollback.stdout).contains("stats: reads rolled back to generation 1"), "{rollback:?}");
    assert_eq!(herald_rebuild::generations::active(&db, "stats").await?, 1);
    let forth = Command::new(env!("CARGO_BIN_EXE_herald")).args(args(&["switch", "stats"])).output().await?;
    assert_eq!(forth.status.code(), Some(2), "the rollback left generation 2 retired, not ready: nothing to switch to");

    // Manual switch and status, as an operator would.
    let switch = Command::new(env!("CARGO_BIN_EXE_herald")).args(args(&["switch", "search"])).output().await?;
    assert!(switch.status.success(), "{}", String::from_utf8_lossy(&switch.stderr));
    let status = Command::new(env!("CARGO_BIN_EXE_herald")).args(args(&["status", "--json"])).output().await?;
    let generations: Value = serde_json::from_slice(&status.stdout)?;
    assert_eq!(generations[0]["generation"], 2);
    assert_eq!(generations[0]["state"], "active");
    assert_eq!(generations[1]["state"], "retired");
    let again = Command::new(env!("CARGO_BIN_EXE_herald")).args(args(&["switch", "search"])).output().await?;
    assert_eq!(again.status.code(), Some(2), "nothing ready to switch to");
    running.stop().await
}
