//! `herald consume`, `herald dlq` and `herald inbox` as real processes: a
//! consumer SIGKILLed between its database commit and its offset commit, two
//! processes of one subscription sharing its partitions, and the dead-letter
//! CLI. Kill-and-restart runs on the mock cluster (hosted by this test
//! process), whose fault switches the test needs; membership churn on Apache
//! Kafka is `consumer_churn.rs`.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald::bench::workload;
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_store::{Db, dead_letter, inbox};
use herald_testkit::TestDb;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset};
use sqlx::Row;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

const PARTITIONS: i32 = 4;

enum Database {
    Postgres,
    Sqlite,
}

struct Bed {
    db: Db,
    url: String,
    topics: Topics,
    prefix: String,
    group_prefix: String,
    kafka: EmbeddedKafka,
    run: String,
    _test_db: TestDb,
}

async fn bed(database: Database) -> anyhow::Result<Bed> {
    let test_db = match database {
        Database::Postgres => herald_testkit::postgres_db().await?,
        Database::Sqlite => herald_testkit::sqlite_db()?,
    };
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let prefix = herald_testkit::unique("t");
    let topics = Topics::with_prefix(&prefix);
    let kafka = EmbeddedKafka::start(1, &topics.all(), PARTITIONS)?;
    Ok(Bed {
        db,
        url: test_db.url.clone(),
        topics,
        prefix,
        group_prefix: herald_testkit::unique("herald"),
        kafka,
        run: herald_testkit::unique("run"),
        _test_db: test_db,
    })
}

/// A `herald consume` child; its stderr lines (logs, fault markers) are
/// collected as they come, its stdout (the summary) when it exits.
struct ConsumeProcess {
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Bed {
    fn herald(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
        cmd.env("NO_COLOR", "1").env("HERALD_LOG", "info").env_remove("HERALD_FAULT");
        cmd
    }

    fn consume(&self, subscription: &str, fault: Option<&str>) -> anyhow::Result<ConsumeProcess> {
        let mut cmd = self.herald();
        cmd.args(["consume", subscription, "--database", &self.url, "--kafka", self.kafka.bootstrap_servers()])
            .args(["--topic-prefix", &self.prefix, "--group-prefix", &self.group_prefix, "--max-batch", "10"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(fault) = fault {
            cmd.env("HERALD_FAULT", fault);
        }
        let mut child = cmd.spawn()?;
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = stderr.clone();
        let pipe = child.stderr.take().expect("piped stderr");
        tokio::spawn(async move {
            let mut reader = BufReader::new(pipe).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                lines.lock().expect("lock").push(line);
            }
        });
        Ok(ConsumeProcess { child, stderr })
    }

    async fn publish(&self, from: usize, n: usize) -> anyhow::Result<()> {
        let events = workload::completions(&self.topics.events, &self.run, from + n)?;
        workload::publish(&workload::producer(&KafkaConfig::new(self.kafka.bootstrap_servers()))?, &events[from..]).await
    }

    /// Sum over partitions of the offsets `group` has committed.
    /// The group's committed offsets (summed) once they are final: an
    /// auto-commit a killed member sent just before it died may still be
    /// queued at the coordinator, so this joins the group as a member that
    /// never commits and reads only when it holds every partition — the
    /// coordinator has expired the dead member by then.
    async fn committed(&self, subscription: &str) -> anyhow::Result<i64> {
        let (brokers, topic) = (self.kafka.bootstrap_servers().to_owned(), self.topics.events.clone());
        let group = format!("{}.{subscription}", self.group_prefix);
        tokio::task::spawn_blocking(move || -> anyhow::Result<i64> {
            let probe: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .set("group.id", &group)
                .set("enable.auto.commit", "false")
                .set("session.timeout.ms", "6000")
                .create()?;
            probe.subscribe(&[&topic])?;
            let deadline = std::time::Instant::now() + PATIENCE;
            while probe.assignment()?.count() < PARTITIONS as usize {
                anyhow::ensure!(std::time::Instant::now() < deadline, "the probe never held all {PARTITIONS} partitions");
                if let Some(Err(e)) = probe.poll(Duration::from_millis(100)) {
                    anyhow::bail!("probe: {e}");
                }
            }
            let committed = probe.committed(Duration::from_secs(10))?;
            probe.unsubscribe();
            Ok(committed.elements().iter().map(|e| if let Offset::Offset(o) = e.offset() { o } else { 0 }).sum())
        })
        .await?
    }
}

impl ConsumeProcess {
    fn lines(&self) -> Vec<String> {
        self.stderr.lock().expect("lock").clone()
    }

    async fn wait_line(&self, needle: &str) -> anyhow::Result<()> {
        herald_testkit::wait_until(&format!("`{needle}` on stderr"), PATIENCE, || async {
            Ok(self.lines().iter().any(|l| l.contains(needle)))
        })
        .await
    }

    /// SIGTERM, then the one-line JSON summary it prints on the way out.
    async fn terminate(mut self) -> anyhow::Result<serde_json::Value> {
        let pid = self.child.id().expect("running").to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().await?;
        anyhow::ensure!(status.success(), "kill -TERM failed");
        let mut out = String::new();
        self.child.stdout.take().expect("piped stdout").read_to_string(&mut out).await?;
        let exit = self.child.wait().await?;
        anyhow::ensure!(exit.success(), "consumer exited with {exit}: {:?}", self.lines());
        Ok(serde_json::from_str(out.trim())?)
    }

    /// The partitions this process holds now, from its rebalance log lines.
    fn assignment(&self) -> Vec<String> {
        let mut current = Vec::new();
        for line in self.lines() {
            let field = line.split_whitespace().find_map(|w| w.strip_prefix("partitions=")).unwrap_or("");
            if line.contains("partitions assigned") {
                current = field.split(',').filter(|p| !p.is_empty()).map(str::to_owned).collect();
            } else if line.contains("partitions revoked") {
                current.clear();
            }
        }
        current
    }
}

async fn count(db: &Db, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query(sql).fetch_one(db.pool()).await?.try_get("n")?)
}

async fn stats_total(db: &Db) -> anyhow::Result<i64> {
    count(db, "SELECT CAST(COALESCE(SUM(exports), 0) AS BIGINT) AS n FROM stats_counters").await
}

// --- SIGKILL between the database commit and the offset commit ----------------

async fn sigkill_between_commit_and_offsets(database: Database) -> anyhow::Result<()> {
    let bed = bed(database).await?;
    bed.publish(0, 60).await?;
    // Stats: an increment per event, so a second application would show.
    let mut first = bed.consume("stats", Some("pause-after-commit:2"))?;
    first.wait_line("herald-fault: paused after commit of batch 2").await?;
    first.child.start_kill()?; // SIGKILL
    first.child.wait().await?;
    let applied = inbox::count(&bed.db, "stats").await?;
    let committed = bed.committed("stats").await?;
    assert!(applied >= 2, "two batches committed before the kill: {applied}");
    assert!(committed < applied, "the kill fell between the database commit ({applied} applied) and the offset commit ({committed})");
    assert_eq!(stats_total(&bed.db).await?, applied, "effects and inbox rows committed together");

    let second = bed.consume("stats", None)?;
    herald_testkit::wait_until("stats to apply all 60", PATIENCE, || async { Ok(inbox::count(&bed.db, "stats").await? == 60) }).await?;
    let summary = second.terminate().await?;
    // Some of the applied-but-uncommitted records came back and were
    // absorbed, and none that had been committed. Not an equality: twice in
    // CI (mock cluster, SQLite) the probe read no committed offset while the
    // next member started 15 records in, so the probe's reading is only a
    // lower bound of what the group had committed.
    let duplicates = summary["duplicates"].as_i64().unwrap_or(-1);
    assert!(
        duplicates > 0 && duplicates <= applied - committed,
        "applied-but-uncommitted records came back, and were absorbed: {summary} (applied {applied}, committed {committed})"
    );
    assert_eq!(summary["applied"], 60 - applied, "{summary}");
    assert_eq!(stats_total(&bed.db).await?, 60, "no duplicate effect, no lost event");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_between_commit_and_offsets_postgres_mock_cluster() -> anyhow::Result<()> {
    sigkill_between_commit_and_offsets(Database::Postgres).await
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_between_commit_and_offsets_sqlite_mock_cluster() -> anyhow::Result<()> {
    sigkill_between_commit_and_offsets(Database::Sqlite).await
}

// --- two processes of one subscription ------------------------------------------

async fn two_processes_share_partitions(database: Database) -> anyhow::Result<()> {
    let bed = bed(database).await?;
    let a = bed.consume("search", None)?;
    let b = bed.consume("search", None)?;
    herald_testkit::wait_until("both processes to hold partitions", PATIENCE, || async {
        let (pa, pb) = (a.assignment(), b.assignment());
        let disjoint = pa.iter().all(|p| !pb.contains(p));
        Ok(!pa.is_empty() && !pb.is_empty() && disjoint && pa.len() + pb.len() == PARTITIONS as usize)
    })
    .await?;
    bed.publish(0, 200).await?;
    herald_testkit::wait_until("200 search documents", PATIENCE, || async {
        Ok(count(&bed.db, "SELECT COUNT(*) AS n FROM search_documents").await? == 200)
    })
    .await?;
    let (sa, sb) = (a.terminate().await?, b.terminate().await?);
    let (na, nb) = (sa["applied"].as_i64().unwrap_or(0), sb["applied"].as_i64().unwrap_or(0));
    assert!(na > 0 && nb > 0, "both applied a share: {sa} {sb}");
    assert_eq!(na + nb, 200, "together, each event once: {sa} {sb}");
    assert_eq!(inbox::count(&bed.db, "search").await?, 200);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn two_processes_share_partitions_postgres_mock_cluster() -> anyhow::Result<()> {
    two_processes_share_partitions(Database::Postgres).await
}

#[tokio::test(flavor = "multi_thread")]
async fn two_processes_share_partitions_sqlite_mock_cluster() -> anyhow::Result<()> {
    two_processes_share_partitions(Database::Sqlite).await
}

// --- dead-letter CLI ------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn dlq_cli_lists_redrives_and_refuses_bad_input() -> anyhow::Result<()> {
    let bed = bed(Database::Sqlite).await?;
    sqlx::query("CREATE TRIGGER refuse_poison BEFORE INSERT ON search_documents WHEN NEW.query = 'poison' BEGIN SELECT RAISE(ABORT, 'refused by defect'); END")
        .execute(bed.db.pool())
        .await?;
    let producer = workload::producer(&KafkaConfig::new(bed.kafka.bootstrap_servers()))?;
    workload::publish_raw(&producer, &bed.topics.events, "k", b"not an event", None).await?;
    let mut poison = workload::completion(&bed.run, 1);
    poison.query = "poison".into();
    let poison_event = herald_envelope::OutboxEvent::new(&bed.topics.events, "k", &poison, chrono::Utc::now())?;
    workload::publish(&producer, std::slice::from_ref(&poison_event)).await?;
    bed.publish(2, 3).await?;

    let consumer = bed.consume("search", None)?;
    herald_testkit::wait_until("2 dead letters and 3 documents", PATIENCE, || async {
        Ok(dead_letter::count(&bed.db, "search", dead_letter::DEAD).await? == 2 && inbox::count(&bed.db, "search").await? == 3)
    })
    .await?;
    consumer.terminate().await?;

    let run = |args: &[&str]| {
        let mut cmd = bed.herald();
        cmd.args(args);
        async move { cmd.output().await }
    };
    let db_args = ["--database", bed.url.as_str()];
    let listed = run(&[&["dlq", "list", "--json"][..], &db_args].concat()).await?;
    assert!(listed.status.success());
    let letters: serde_json::Value = serde_json::from_slice(&listed.stdout)?;
    let letters = letters.as_array().expect("array").clone();
    assert_eq!(letters.len(), 2);
    let garbage = letters.iter().find(|l| l["event_id"].is_null()).expect("garbage letter");
    assert!(garbage["error"].as_str().unwrap_or("").contains("legacy JSON envelope"), "{garbage}");
    let poisoned = letters.iter().find(|l| l["event_id"] == poison_event.id.as_str()).expect("poison letter");
    assert_eq!(poisoned["attempts"], 3);

    let garbage_id = garbage["id"].to_string();
    let again = run(&[&["dlq", "redrive", garbage_id.as_str()][..], &db_args].concat()).await?;
    assert_eq!(again.status.code(), Some(1), "undecodable bytes still fail: {}", String::from_utf8_lossy(&again.stdout));

    sqlx::query("DROP TRIGGER refuse_poison").execute(bed.db.pool()).await?;
    let poison_id = poisoned["id"].to_string();
    let fixed = run(&[&["dlq", "redrive", poison_id.as_str()][..], &db_args].concat()).await?;
    assert!(fixed.status.success(), "{}", String::from_utf8_lossy(&fixed.stdout));
    assert!(String::from_utf8_lossy(&fixed.stdout).contains("applied"));
    let twice = run(&[&["dlq", "redrive", poison_id.as_str()][..], &db_args].concat()).await?;
    assert!(String::from_utf8_lossy(&twice.stdout).contains("not dead"), "{}", String::from_utf8_lossy(&twice.stdout));
    assert_eq!(count(&bed.db, "SELECT COUNT(*) AS n FROM search_documents").await?, 4, "the poison applied once after the fix");
    let remaining = run(&[&["dlq", "list", "--json", "--subscription", "search"][..], &db_args].concat()).await?;
    let remaining: serde_json::Value = serde_json::from_slice(&remaining.stdout)?;
    assert_eq!(remaining.as_array().map(Vec::len), Some(1), "only the undecodable record is still dead");

    for bad in [
        vec!["dlq", "redrive", "424242", "--database", bed.url.as_str()],
        vec!["dlq", "redrive", "--database", bed.url.as_str()],
        vec!["dlq", "redrive", "x1", "--database", bed.url.as_str()],
        vec!["dlq", "list", "--subscription", "nosuch", "--database", bed.url.as_str()],
        vec!["consume", "nosuch"],
        vec!["inbox", "cleanup", "--older-than-days", "0", "--database", bed.url.as_str()],
    ] {
        let out = run(&bad).await?;
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(!out.stderr.is_empty(), "{bad:?} explains itself");
    }
    // --force: no cluster is given to read the topic's retention from
    // (the floor itself: inbox_cleanup_cli.rs).
    let cleanup = run(&["inbox", "cleanup", "--older-than-days", "30", "--force", "--database", bed.url.as_str()]).await?;
    assert!(cleanup.status.success(), "{}", String::from_utf8_lossy(&cleanup.stderr));
    assert_eq!(inbox::count(&bed.db, "search").await?, 4, "rows younger than the retention stay");
    Ok(())
}

/// How long a test here waits for an eventual outcome.
const PATIENCE: Duration = Duration::from_secs(120);
