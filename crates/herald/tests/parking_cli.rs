//! Per-key parking as an operator meets it, with real processes: `herald
//! consume search --order per-key` parks the records of a poisoned key
//! behind its dead letter, `herald status` and `herald dlq list` show them,
//! and `herald dlq redrive` (after the fix) or `herald dlq discard` applies
//! them; bad input exits 2. The mock cluster is hosted by this test process.

use std::process::{Output, Stdio};
use std::time::Duration;

use herald::bench::workload;
use herald_envelope::OutboxEvent;
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_store::{Backend, Db, dead_letter, inbox, parked};
use herald_testkit::TestDb;
use sqlx::Row;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

const KEY: &str = "job-family-7";

enum Settle {
    /// Fix the defect, then `dlq redrive`.
    Redrive,
    /// `dlq discard`, defect and all.
    Discard,
}

struct Bed {
    db: Db,
    url: String,
    prefix: String,
    topics: Topics,
    group_prefix: String,
    kafka: EmbeddedKafka,
    _test_db: TestDb,
}

impl Bed {
    fn herald(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_herald"));
        cmd.env("NO_COLOR", "1").env("HERALD_LOG", "warn").env_remove("HERALD_FAULT").env_remove("HERALD_DATABASE_URL");
        cmd
    }

    async fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        Ok(self.herald().args(args).output().await?)
    }

    fn consume(&self, order: &str) -> anyhow::Result<Child> {
        let mut cmd = self.herald();
        cmd.args(["consume", "search", "--order", order, "--database", &self.url, "--kafka", self.kafka.bootstrap_servers()])
            .args(["--topic-prefix", &self.prefix, "--group-prefix", &self.group_prefix, "--max-batch", "3"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        Ok(cmd.spawn()?)
    }

    async fn documents(&self) -> anyhow::Result<i64> {
        Ok(sqlx::query("SELECT COUNT(*) AS n FROM search_documents").fetch_one(self.db.pool()).await?.try_get("n")?)
    }
}

/// The defect the fix removes: the search table refuses one query text.
async fn defect(db: &Db, install: bool) -> anyhow::Result<()> {
    let statements: &[&str] = match (db.backend(), install) {
        (Backend::Postgres, true) => &[
            "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF NEW.query = 'poison' THEN RAISE EXCEPTION 'query text refused by defect'; END IF; RETURN NEW; END $$",
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON search_documents FOR EACH ROW EXECUTE FUNCTION refuse_poison()",
        ],
        (Backend::Sqlite, true) => &["CREATE TRIGGER refuse_poison BEFORE INSERT ON search_documents WHEN NEW.query = 'poison' \
             BEGIN SELECT RAISE(ABORT, 'query text refused by defect'); END"],
        (Backend::Postgres, false) => &["DROP TRIGGER refuse_poison ON search_documents"],
        (Backend::Sqlite, false) => &["DROP TRIGGER refuse_poison"],
    };
    for sql in statements {
        sqlx::query(sql).execute(db.pool()).await?;
    }
    Ok(())
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn parked_behind_poison_then_settled(test_db: TestDb, settle: Settle) -> anyhow::Result<()> {
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let prefix = herald_testkit::unique("t");
    let topics = Topics::with_prefix(&prefix);
    let kafka = EmbeddedKafka::start(1, &topics.all(), 4)?;
    let bed =
        Bed { db, url: test_db.url.clone(), prefix, topics, group_prefix: herald_testkit::unique("herald"), kafka, _test_db: test_db };
    defect(&bed.db, true).await?;

    // The poison, then three completions of its key; four of other keys.
    let run = herald_testkit::unique("run");
    let mut keyed: Vec<OutboxEvent> = workload::completions(&bed.topics.events, &run, 4)?;
    let mut poison = workload::completion(&run, 0);
    poison.query = "poison".into();
    keyed[0] = OutboxEvent::new(&bed.topics.events, KEY, &poison, chrono::Utc::now())?;
    for e in &mut keyed {
        e.partition_key = KEY.into();
    }
    let others: Vec<OutboxEvent> = workload::completions(&bed.topics.events, &run, 8)?.split_off(4);
    let producer = workload::producer(&KafkaConfig::new(bed.kafka.bootstrap_servers()))?;
    for (k, o) in keyed.iter().zip(&others) {
        workload::publish(&producer, &[k.clone(), o.clone()]).await?;
    }

    let mut consumer = bed.consume("per-key")?;
    herald_testkit::wait_until("the poison dead, its key's three parked, the others applied", PATIENCE, || async {
        Ok(dead_letter::count(&bed.db, "search", dead_letter::DEAD).await? == 1
            && parked::summary(&bed.db, "search", 5).await?.records == 3
            && inbox::count(&bed.db, "search").await? == 4)
    })
    .await?;
    assert_eq!(bed.documents().await?, 4, "nothing of the poisoned key applied");
    let letter = dead_letter::list(&bed.db, Some("search"), Some(dead_letter::DEAD)).await?.remove(0);
    let id = letter.id.to_string();
    let db_args = ["--database", bed.url.as_str()];

    let status = bed.run(&[&["status", "--json"][..], &db_args].concat()).await?;
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout)?;
    let search = status["subscriptions"].as_array().and_then(|s| s.iter().find(|s| s["name"] == "search")).expect("search").clone();
    assert_eq!((search["parked_records"].as_i64(), search["parked_keys"].as_i64()), (Some(3), Some(1)), "{search}");
    assert_eq!(search["oldest_parked"][0]["key"], KEY, "{search}");
    assert_eq!(search["oldest_parked"][0]["blocked_by"], letter.id, "{search}");
    let table = stdout(&bed.run(&[&["status"][..], &db_args].concat()).await?);
    assert!(table.contains(&format!("key {KEY} (")) && table.contains("3 record(s)"), "{table}");

    let listed = bed.run(&[&["dlq", "list", "--json"][..], &db_args].concat()).await?;
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout)?;
    assert_eq!((listed[0]["parked"].as_i64(), listed[0]["record_key"].as_str()), (Some(3), Some(KEY)), "{listed}");

    for bad in [vec!["dlq", "discard", "424242"], vec!["dlq", "discard", "x1"], vec!["dlq", "discard"]] {
        let out = bed.run(&[&bad[..], &db_args].concat()).await?;
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(!out.stderr.is_empty(), "{bad:?} explains itself");
    }
    let out = bed.run(&["consume", "search", "--order", "sideways"]).await?;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("per-key"), "names the choices");

    let (verb, documents) = match settle {
        Settle::Redrive => {
            defect(&bed.db, false).await?;
            ("redrive", 8)
        }
        Settle::Discard => ("discard", 7),
    };
    let settled = bed.run(&[&["dlq", verb, id.as_str()][..], &db_args].concat()).await?;
    assert!(settled.status.success(), "{}", stdout(&settled));
    assert!(stdout(&settled).contains("released 3 parked record(s): 3 applied"), "{}", stdout(&settled));
    assert_eq!(bed.documents().await?, documents);
    assert_eq!(inbox::count(&bed.db, "search").await?, documents);
    assert_eq!(parked::summary(&bed.db, "search", 5).await?, parked::Summary::default());
    let again = bed.run(&[&["dlq", "discard", id.as_str()][..], &db_args].concat()).await?;
    assert_eq!(again.status.code(), Some(2), "only a dead letter can be discarded");
    assert!(String::from_utf8_lossy(&again.stderr).contains("not dead"));

    // The key is free: its next record goes straight through.
    let mut next = workload::completions(&bed.topics.events, &run, 9)?.split_off(8);
    next[0].partition_key = KEY.into();
    workload::publish(&producer, &next).await?;
    herald_testkit::wait_until("the key's next record applied", PATIENCE, || async { Ok(bed.documents().await? == documents + 1) }).await?;

    let pid = consumer.id().expect("running").to_string();
    anyhow::ensure!(Command::new("kill").args(["-TERM", &pid]).status().await?.success(), "kill -TERM failed");
    let mut out = String::new();
    consumer.stdout.take().expect("piped").read_to_string(&mut out).await?;
    anyhow::ensure!(consumer.wait().await?.success(), "consumer failed");
    let summary: serde_json::Value = serde_json::from_str(out.trim())?;
    assert_eq!((summary["dead_lettered"].as_i64(), summary["parked"].as_i64()), (Some(1), Some(3)), "{summary}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn per_key_parking_redrive_postgres() -> anyhow::Result<()> {
    parked_behind_poison_then_settled(herald_testkit::postgres_db().await?, Settle::Redrive).await
}

#[tokio::test(flavor = "multi_thread")]
async fn per_key_parking_discard_sqlite() -> anyhow::Result<()> {
    parked_behind_poison_then_settled(herald_testkit::sqlite_db()?, Settle::Discard).await
}

/// How long a test here waits for an eventual outcome.
const PATIENCE: Duration = Duration::from_secs(120);
