//! Consumer processes of one subscription join and leave every few seconds
//! under load, on the shared Apache Kafka cluster, with rebalances run by the
//! real group coordinator (classic protocol, librdkafka's eager `range,
//! roundrobin` assignors): some leave cleanly (SIGTERM), some die (SIGKILL)
//! and are noticed only when their session times out. Afterwards: every
//! event applied exactly once in the subscription's tables (the inbox guards
//! the effect), the group's lag back to 0, and no partition left without a
//! consumer (events on every partition published after the churn are all
//! applied).

use std::process::Stdio;
use std::time::Duration;

use herald::bench::workload;
use herald_kafka::KafkaConfig;
use herald_kafka::offsets;
use herald_kafka::{TopicSettings, Topics};
use herald_store::Db;
use herald_testkit::wait_until;
use sqlx::Row;
use tokio::process::{Child, Command};

const PARTITIONS: i32 = 6;
const EVENTS: usize = 3000;
const AFTER: usize = 120;

struct Bed {
    url: String,
    brokers: String,
    prefix: String,
    group_prefix: String,
    topics: Topics,
}

impl Bed {
    fn consume(&self) -> anyhow::Result<Child> {
        Ok(Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(["consume", "stats", "--database", &self.url, "--kafka", &self.brokers])
            .args(["--topic-prefix", &self.prefix, "--group-prefix", &self.group_prefix, "--max-batch", "50"])
            .env("HERALD_LOG", "warn")
            .env_remove("HERALD_FAULT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?)
    }

    /// True when the group has committed every partition's end.
    async fn caught_up(&self) -> anyhow::Result<bool> {
        let group = format!("{}.stats", self.group_prefix);
        let states = offsets::partition_states(&KafkaConfig::new(&self.brokers), &group, &self.topics.events).await?;
        Ok(states.len() == PARTITIONS as usize && states.iter().all(|p| p.committed == Some(p.high)))
    }
}

async fn count(db: &Db, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query(sql).fetch_one(db.pool()).await?.try_get::<i64, _>("n")?)
}

async fn terminate(mut child: Child) -> anyhow::Result<()> {
    if let Some(pid) = child.id() {
        Command::new("kill").args(["-TERM", &pid.to_string()]).status().await?;
    }
    if tokio::time::timeout(Duration::from_secs(30), child.wait()).await.is_err() {
        child.kill().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn consumers_joining_and_leaving_under_load_apply_each_event_once() -> anyhow::Result<()> {
    let brokers = herald_testkit::real_broker()?;
    let prefix = herald_testkit::unique("churn");
    let topics = Topics::with_prefix(&prefix);
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), TopicSettings::partitions(PARTITIONS)).await?;
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let bed = Bed { url: test_db.url.clone(), brokers: brokers.clone(), prefix, group_prefix: herald_testkit::unique("herald"), topics };
    let seed = std::env::var("HERALD_CHURN_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| fastrand::u64(..));
    println!("churn schedule: HERALD_CHURN_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);

    let run = herald_testkit::unique("run");
    let events = workload::completions(&bed.topics.events, &run, EVENTS + AFTER)?;
    let producer = workload::producer(&KafkaConfig::new(&brokers))?;
    // Load: 50 events every 500 ms for about 30 s.
    let load = {
        let (producer, events) = (producer.clone(), events[..EVENTS].to_vec());
        tokio::spawn(async move {
            for chunk in events.chunks(50) {
                workload::publish(&producer, chunk).await?;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            anyhow::Ok(())
        })
    };

    let mut members: Vec<Child> = vec![bed.consume()?, bed.consume()?];
    let (mut joins, mut kills, mut leaves) = (2, 0, 0);
    // Every kind of change happens whatever the seed: a join, a SIGKILL, a
    // join, a clean leave; the seed decides the rest. (Drawn at random from
    // the start, a seed without a SIGKILL failed the run.)
    let mut opening = [0u8, 1, 0, 2].into_iter();
    while !load.is_finished() {
        // The churn's cadence: one membership change every 2 to 4 seconds.
        tokio::time::sleep(Duration::from_millis(rng.u64(2000..4000))).await;
        let action = if let Some(action) = opening.next() {
            action
        } else if members.len() < 2 {
            0
        } else if members.len() >= 4 {
            1 + rng.u8(0..2)
        } else {
            rng.u8(0..3)
        };
        match action {
            0 => {
                members.push(bed.consume()?);
                joins += 1;
            }
            1 => {
                let mut victim = members.swap_remove(rng.usize(..members.len()));
                victim.kill().await?; // SIGKILL: its session must time out.
                kills += 1;
            }
            _ => {
                terminate(members.swap_remove(rng.usize(..members.len()))).await?;
                leaves += 1;
            }
        }
    }
    load.await??;
    println!("{joins} joins, {kills} SIGKILLs, {leaves} clean leaves; {} members at the end", members.len());
    assert!(kills >= 1 && leaves >= 1 && joins >= 4, "the schedule churned: {joins} joins, {kills} kills, {leaves} leaves");

    let applied = "SELECT COUNT(*) AS n FROM inbox WHERE subscription = 'stats'";
    wait_until("every event applied and the lag at 0", Duration::from_secs(180), || async {
        Ok(count(&db, applied).await? == EVENTS as i64 && bed.caught_up().await?)
    })
    .await?;
    // Events on every partition after the churn: each one needs a member.
    workload::publish(&producer, &events[EVENTS..]).await?;
    let total = (EVENTS + AFTER) as i64;
    wait_until("the later events applied on every partition", Duration::from_secs(120), || async {
        Ok(count(&db, applied).await? == total && bed.caught_up().await?)
    })
    .await?;
    for member in members {
        terminate(member).await?;
    }

    let counted = count(&db, "SELECT CAST(COALESCE(SUM(exports), 0) AS BIGINT) AS n FROM stats_counters").await?;
    assert_eq!(counted, total, "each completion counted once, whatever was redelivered in the rebalances");
    assert_eq!(count(&db, "SELECT COUNT(*) AS n FROM dead_letters").await?, 0);
    Ok(())
}
