//! The export worker's consumer sets poison commands aside like every
//! subscription does: a record that does not decode, and a command whose job
//! the database refuses for good (a trigger standing in for a defect), are
//! dead-lettered with their bytes and reason under `export-workers`; the
//! partition moves on to the next command; `herald dlq list` shows them and
//! `herald dlq redrive` hands them back to the worker, which after the fix
//! runs the export once. Retryable failures — the database cut off, an
//! injected infrastructure fault — pause the worker on the record and never
//! dead-letter it. Kafka is the in-process mock cluster, one partition, so
//! the three commands queue behind each other.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use herald::bench::workload;
use herald::pipeline::{self, RoleOptions, Roles, Running, Wiring};
use herald_api::Tokens;
use herald_export::{ExportRequest, Format, IntakeConfig, jobs};
use herald_fault::{Action, Hook, Point};
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_store::{Db, dead_letter};
use herald_testkit::{TestDb, unique};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sqlx::Row;
use tokio::process::Command;

const WORKERS: &str = "export-workers";
const GARBAGE: &[u8] = b"\x00not a command";

struct Bed {
    db: Db,
    url: String,
    postgres: bool,
    prefix: String,
    topics: Topics,
    group_prefix: String,
    kafka: EmbeddedKafka,
    artifacts: tempfile::TempDir,
    _test_db: TestDb,
}

async fn bed(test_db: TestDb) -> anyhow::Result<Bed> {
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let prefix = unique("wdlq");
    let topics = Topics::with_prefix(&prefix);
    let kafka = EmbeddedKafka::start(1, &topics.all(), 1)?;
    Ok(Bed {
        db,
        url: test_db.url.clone(),
        postgres: test_db.is_postgres(),
        prefix,
        topics,
        group_prefix: unique("herald"),
        kafka,
        artifacts: tempfile::tempdir()?,
        _test_db: test_db,
    })
}

impl Bed {
    /// A command record that does not decode.
    async fn publish_garbage(&self) -> anyhow::Result<()> {
        let producer = workload::producer(&KafkaConfig::new(self.kafka.bootstrap_servers()))?;
        workload::publish_raw(&producer, &self.topics.commands, "garbage", GARBAGE, None).await
    }

    fn wiring(&self, db: &Db) -> Wiring {
        Wiring {
            db: db.clone(),
            kafka: KafkaConfig::new(self.kafka.bootstrap_servers()),
            topics: self.topics.clone(),
            group_prefix: self.group_prefix.clone(),
            artifacts: self.artifacts.path().display().to_string(),
            tokens: Tokens::single("t", "alice"),
        }
    }

    async fn start(&self, db: &Db, relay: bool, worker: bool, faults: Hook) -> anyhow::Result<Running> {
        let roles = Roles { api: None, relay, worker, subscriptions: false, dispatcher: false };
        pipeline::start_roles(self.wiring(db), roles, RoleOptions { faults, ..RoleOptions::default() }).await
    }

    async fn submit(&self, key: &str, query: &str) -> anyhow::Result<String> {
        let request = ExportRequest { format: Format::Csv, query: query.into() };
        Ok(jobs::submit(&self.db, &IntakeConfig::new(self.topics.clone()), "alice", key, &request).await?.job().job_id.clone())
    }

    async fn status(&self, job_id: &str) -> anyhow::Result<(String, i64)> {
        let job = jobs::get_any(&self.db, job_id).await?.ok_or_else(|| anyhow::anyhow!("no job {job_id}"))?;
        Ok((job.status, job.generation))
    }

    async fn count(&self, sql: &str, job_id: &str) -> anyhow::Result<i64> {
        Ok(sqlx::query(sql).bind(job_id).fetch_one(self.db.pool()).await?.try_get("n")?)
    }

    async fn completions(&self, job_id: &str) -> anyhow::Result<i64> {
        let sql = "SELECT COUNT(*) AS n FROM outbox WHERE event_type = 'herald.export.completed' AND subject = $1";
        self.count(sql, job_id).await
    }

    /// A defect stand-in: the database refuses to start the attempt of a job
    /// asking for `poison`, with an error no retry fixes.
    async fn refuse_poison(&self) -> anyhow::Result<()> {
        let statements: &[&str] = if self.postgres {
            &[
                "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                 IF NEW.query = 'poison' AND NEW.status = 'running' THEN RAISE EXCEPTION 'refused by defect'; END IF; \
                 RETURN NEW; END $$",
                "CREATE TRIGGER refuse_poison BEFORE UPDATE ON export_jobs FOR EACH ROW EXECUTE FUNCTION refuse_poison()",
            ]
        } else {
            &["CREATE TRIGGER refuse_poison BEFORE UPDATE ON export_jobs WHEN NEW.query = 'poison' AND NEW.status = 'running' \
               BEGIN SELECT RAISE(ABORT, 'refused by defect'); END"]
        };
        for sql in statements {
            sqlx::query(sql).execute(self.db.pool()).await?;
        }
        Ok(())
    }

    async fn fix(&self) -> anyhow::Result<()> {
        let sql = if self.postgres { "DROP TRIGGER refuse_poison ON export_jobs" } else { "DROP TRIGGER refuse_poison" };
        sqlx::query(sql).execute(self.db.pool()).await?;
        Ok(())
    }

    /// Sum of the offsets the workers' group committed on the commands topic.
    async fn committed(&self) -> anyhow::Result<i64> {
        let (brokers, topic) = (self.kafka.bootstrap_servers().to_owned(), self.topics.commands.clone());
        let group = format!("{}.{WORKERS}", self.group_prefix);
        tokio::task::spawn_blocking(move || -> anyhow::Result<i64> {
            let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", &brokers).set("group.id", &group).create()?;
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&topic, 0);
            let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
            Ok(committed.elements().iter().map(|e| if let Offset::Offset(o) = e.offset() { o } else { 0 }).sum())
        })
        .await?
    }

    /// `herald dlq …` against this bed, with the workers' settings.
    async fn dlq(&self, args: &[&str]) -> anyhow::Result<(Option<i32>, String, String)> {
        let out = Command::new(env!("CARGO_BIN_EXE_herald"))
            .arg("dlq")
            .args(args)
            .args(["--database", &self.url])
            .env("HERALD_ARTIFACTS", self.artifacts.path())
            .env("HERALD_TOPIC_PREFIX", &self.prefix)
            .env_remove("HERALD_FAULT")
            .output()
            .await?;
        Ok((out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned()))
    }
}

async fn eventually<F, Fut>(what: &str, timeout: Duration, mut probe: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + timeout;
    while !probe().await? {
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn dead(db: &Db) -> anyhow::Result<i64> {
    Ok(dead_letter::count(db, WORKERS, dead_letter::DEAD).await?)
}

// --- poison: dead-lettered, the partition moves on, redriven after the fix -------

async fn poison_commands_are_dead_lettered_and_redriven(test_db: TestDb) -> anyhow::Result<()> {
    let bed = bed(test_db).await?;
    bed.refuse_poison().await?;
    let running = bed.start(&bed.db, true, true, Hook::none()).await?;
    let consumed = async {
        bed.publish_garbage().await?;
        let poison = bed.submit("k-poison", "poison").await?;
        eventually("two dead letters", Duration::from_secs(60), || async { Ok(dead(&bed.db).await? == 2) }).await?;
        // Behind both poison records on the one partition.
        let good = bed.submit("k-good", "good").await?;
        eventually("the next command to run", Duration::from_secs(60), || async { Ok(bed.status(&good).await?.0 == "succeeded") }).await?;
        anyhow::Ok(poison)
    }
    .await;
    // Stopped either way: a consumer left to a dropped runtime hangs the test.
    running.stop().await?;
    let poison = consumed?;
    assert_eq!(bed.committed().await?, 3, "the group moved past garbage, poison and the good command");

    let letters = dead_letter::list(&bed.db, Some(WORKERS), None).await?;
    assert_eq!(letters.len(), 2, "{letters:?}");
    let garbage = letters.iter().find(|l| l.event_id.is_none()).expect("garbage letter");
    assert_eq!((garbage.value.as_deref(), garbage.record_key.as_deref()), (Some(GARBAGE), Some(&b"garbage"[..])));
    assert_eq!((garbage.topic.as_str(), garbage.partition, garbage.offset), (bed.topics.commands.as_str(), 0, 0));
    assert!(garbage.error.contains("CloudEvent"), "the reason names what is wrong: {}", garbage.error);
    let letter = letters.iter().find(|l| l.event_id.is_some()).expect("poison letter");
    let (command_id, command_data): (String, Vec<u8>) = {
        let row = sqlx::query("SELECT event_id, data FROM outbox WHERE event_type = 'herald.export.requested' AND subject = $1")
            .bind(&poison)
            .fetch_one(bed.db.pool())
            .await?;
        (row.try_get("event_id")?, row.try_get("data")?)
    };
    assert_eq!(letter.event_id.as_deref(), Some(command_id.as_str()));
    assert_eq!(letter.event_type.as_deref(), Some("herald.export.requested"));
    assert_eq!(letter.value.as_deref(), Some(command_data.as_slice()), "the command's bytes are kept");
    assert!(letter.error.contains("refused by defect") && letter.attempts == 3, "{letter:?}");
    assert_eq!(bed.status(&poison).await?, ("pending".to_owned(), 0), "no attempt of the poison job started");

    let (code, listed, _) = bed.dlq(&["list", "--json", "--subscription", WORKERS]).await?;
    assert_eq!(code, Some(0));
    let listed: serde_json::Value = serde_json::from_str(&listed)?;
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed:#}");
    assert!(listed.as_array().into_iter().flatten().all(|l| l["subscription"] == WORKERS), "{listed:#}");

    let id = letter.id.to_string();
    let (code, out, _) = bed.dlq(&["redrive", &id]).await?;
    assert_eq!(code, Some(1), "still refused before the fix: {out}");
    assert!(out.contains("still failing") && bed.completions(&poison).await? == 0, "{out}");
    assert_eq!(dead_letter::get(&bed.db, letter.id).await?.map(|l| (l.status, l.attempts)), Some(("dead".to_owned(), 4)));

    bed.fix().await?;
    let (code, out, err) = bed.dlq(&["redrive", &id]).await?;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains(&format!("dead letter {id} ({WORKERS}): applied")), "{out}");
    let job = jobs::get_any(&bed.db, &poison).await?.expect("job");
    assert_eq!((job.status.as_str(), job.generation), ("succeeded", 1), "one attempt, by the redrive");
    let topic: String = sqlx::query("SELECT topic FROM outbox WHERE event_type = 'herald.export.completed' AND subject = $1")
        .bind(&poison)
        .fetch_one(bed.db.pool())
        .await?
        .try_get("topic")?;
    assert_eq!(topic, bed.topics.events, "the completion went where the workers send theirs");
    let store = herald_export::artifact::ArtifactStore::local(bed.artifacts.path())?;
    assert!(store.exists(job.result_id.as_deref().expect("result")).await?, "in the workers' artifact store");

    let (_, again, _) = bed.dlq(&["redrive", &id]).await?;
    assert!(again.contains("not dead"), "{again}");
    let (code, rest, _) = bed.dlq(&["redrive", "--subscription", WORKERS]).await?;
    assert_eq!(code, Some(1), "only the undecodable record is left, and it still fails: {rest}");
    assert!(rest.contains(&format!("dead letter {} ({WORKERS}): still failing", garbage.id)), "{rest}");
    assert_eq!(bed.completions(&poison).await?, 1, "applied once");
    assert_eq!(dead(&bed.db).await?, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn poison_commands_are_dead_lettered_and_redriven_postgres() -> anyhow::Result<()> {
    poison_commands_are_dead_lettered_and_redriven(herald_testkit::postgres_db().await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn poison_commands_are_dead_lettered_and_redriven_sqlite() -> anyhow::Result<()> {
    poison_commands_are_dead_lettered_and_redriven(herald_testkit::sqlite_db()?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn redriving_a_worker_letter_without_the_artifact_store_exits_2() -> anyhow::Result<()> {
    let bed = bed(herald_testkit::sqlite_db()?).await?;
    let running = bed.start(&bed.db, false, true, Hook::none()).await?;
    let parked = async {
        bed.publish_garbage().await?;
        eventually("the garbage letter", Duration::from_secs(60), || async { Ok(dead(&bed.db).await? == 1) }).await
    }
    .await;
    running.stop().await?;
    parked?;
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["dlq", "redrive", "--subscription", WORKERS, "--database", &bed.url])
        .env_remove("HERALD_ARTIFACTS")
        .output()
        .await?;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--artifacts"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(dead(&bed.db).await?, 1, "nothing touched");
    Ok(())
}

// --- retryable: the worker pauses on the record, nothing is dead-lettered -------

/// Counts the worker's tries to start a job, failing the first `fail` of them.
fn counting(fail: usize) -> (Hook, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let faults = Hook::new(move |site| {
        let n = if site.point == Point::BeforeStart { seen.fetch_add(1, Ordering::SeqCst) + 1 } else { 0 };
        async move {
            match n {
                0 => Action::Continue,
                n if n <= fail => Action::Fail(format!("infrastructure down (try {n})")),
                _ => Action::Continue,
            }
        }
    });
    (faults, calls)
}

async fn retryable_fault_pauses_without_dead_letter(test_db: TestDb) -> anyhow::Result<()> {
    let bed = bed(test_db).await?;
    let (faults, calls) = counting(4);
    let running = bed.start(&bed.db, true, true, faults).await?;
    let done = async {
        let job = bed.submit("k1", "flaky").await?;
        eventually("the job to succeed once the fault clears", Duration::from_secs(60), || async {
            Ok(bed.status(&job).await?.0 == "succeeded")
        })
        .await?;
        anyhow::Ok(job)
    }
    .await;
    running.stop().await?;
    let job = done?;
    assert_eq!(calls.load(Ordering::SeqCst), 5, "the same command was tried again until it went through, never set aside");
    assert_eq!(dead_letter::list(&bed.db, None, None).await?.len(), 0);
    assert_eq!(bed.completions(&job).await?, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn retryable_fault_pauses_without_dead_letter_postgres() -> anyhow::Result<()> {
    retryable_fault_pauses_without_dead_letter(herald_testkit::postgres_db().await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn retryable_fault_pauses_without_dead_letter_sqlite() -> anyhow::Result<()> {
    retryable_fault_pauses_without_dead_letter(herald_testkit::sqlite_db()?).await
}

/// The worker's own connection to PostgreSQL goes through a proxy that is
/// cut while its command arrives: starting the attempt fails with the
/// database unreachable, over and over, until the proxy heals.
#[tokio::test(flavor = "multi_thread")]
async fn database_cut_off_pauses_the_worker_without_dead_letter_postgres() -> anyhow::Result<()> {
    let bed = bed(herald_testkit::postgres_db().await?).await?;
    let mut url = url::Url::parse(&bed.url)?;
    let target = format!("{}:{}", url.host_str().unwrap_or("127.0.0.1"), url.port().unwrap_or(5432)).parse()?;
    let proxy = herald_testkit::CutProxy::start(target).await?;
    url.set_port(Some(proxy.addr().port())).map_err(|()| anyhow::anyhow!("url without port"))?;
    let worker_db = Db::connect(url.as_str()).await?;

    let relay = bed.start(&bed.db, true, false, Hook::none()).await?;
    let (faults, calls) = counting(0);
    let worker = bed.start(&worker_db, false, true, faults).await?;
    let done = async {
        proxy.cut();
        let job = bed.submit("k1", "outage").await?;
        eventually("the worker to try the command twice", Duration::from_secs(120), || async { Ok(calls.load(Ordering::SeqCst) >= 2) })
            .await?;
        anyhow::ensure!(bed.status(&job).await?.0 == "pending", "nothing ran while the database was away");
        proxy.heal();
        eventually("the job to succeed after the outage", Duration::from_secs(90), || async {
            Ok(bed.status(&job).await?.0 == "succeeded")
        })
        .await?;
        anyhow::Ok(job)
    }
    .await;
    proxy.heal();
    worker.stop().await?;
    relay.stop().await?;
    let job = done?;
    assert_eq!(dead_letter::list(&bed.db, None, None).await?.len(), 0, "an outage is not poison");
    assert_eq!(bed.completions(&job).await?, 1);
    Ok(())
}
