//! The classic double notification: two entry points that can both finish
//! the same work item (say an HTTP trigger and a background worker), one
//! processor they both call, and a user who must get exactly one
//! notification. Its first failure: both read the item as open, both notify.
//!
//! Here: entry one is the worker role consuming the export command from
//! Kafka; entry two is a second worker handed the same job directly; both run
//! the one processor, `ExportWorker::handle`. A gate holds both at the race
//! point — right before the conditional start, both having seen the job as
//! startable — and lets them go together. Behind them the whole notification
//! path runs: relay, notify subscription, two dispatchers, and a provider
//! without idempotency keys, so nothing at the provider could hide a second
//! call. One completion, one intent, one provider effect.

#[macro_use]
mod notify_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use herald::pipeline::{self, Dispatch, RoleOptions, Roles, Wiring};
use herald_api::Tokens;
use herald_export::artifact::ArtifactStore;
use herald_export::worker::{ExportWorker, Outcome};
use herald_export::{ExportRequest, Format, IntakeConfig, LeasePolicy, jobs};
use herald_fault::{Action, Hook, Point};
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_notify::dispatcher::{Dispatcher, DispatcherConfig};
use herald_notify::provider::{Capabilities, ProviderClient};
use herald_proof::sim::{self, FaultSwitches, Ledger, SimConfig};
use herald_store::Db;
use herald_testkit::{Gate, unique};
use notify_support::{Backend, database};
use sqlx::Row;
use tokio_util::sync::CancellationToken;

/// Holds the first two arrivals at `BeforeStart` until both are there.
fn race_point() -> Hook {
    let (gate, arrived) = (Gate::new(2), Arc::new(AtomicUsize::new(0)));
    Hook::new(move |site| {
        let (gate, arrived) = (gate.clone(), arrived.clone());
        async move {
            if site.point == Point::BeforeStart && arrived.fetch_add(1, Ordering::SeqCst) < 2 {
                gate.arrive_and_wait().await;
            }
            Action::Continue
        }
    })
}

async fn count(db: &Db, sql: &str, job_id: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query(sql).bind(job_id).fetch_one(db.pool()).await?.try_get(0)?)
}

const COMPLETIONS: &str = "SELECT COUNT(*) FROM outbox WHERE event_type = 'herald.export.completed' AND subject = $1";
const INTENTS: &str = "SELECT COUNT(*) FROM notification_intents WHERE job_id = $1";
const SENT: &str = "SELECT COUNT(*) FROM notification_intents WHERE job_id = $1 AND status = 'sent'";
/// Everything the job caused has been through the relay, the notify inbox
/// and the dispatchers.
const SETTLED: &str = "SELECT (SELECT COUNT(*) FROM notification_intents WHERE status = 'pending') \
    + (SELECT COUNT(*) FROM outbox o WHERE o.event_type = 'herald.export.completed' AND o.subject = $1 \
       AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.subscription = 'notify' AND i.event_id = o.event_id))";

async fn settle(db: &Db, job_id: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let owed = async || herald_store::delivered::count_except(db, herald_store::outbox::DELIVERED).await;
    while owed().await? != 0 || count(db, SETTLED, job_id).await? != 0 || count(db, SENT, job_id).await? == 0 {
        anyhow::ensure!(Instant::now() < deadline, "the notification path never settled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn two_entry_points_one_notification(backend: Backend) -> anyhow::Result<()> {
    let (_test_db, db) = database(backend).await?;
    let topics = Topics::with_prefix(&unique("two-entries"));
    let kafka = EmbeddedKafka::start(1, &topics.all(), 2)?;
    let dir = tempfile::tempdir()?;
    let artifacts = dir.path().join("artifacts").display().to_string();
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite").display().to_string()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let provider = format!("http://{}", listener.local_addr()?);
    let sim_stop = CancellationToken::new();
    let unkeyed = SimConfig::unkeyed();
    tokio::spawn(sim::serve(listener, ledger.clone(), unkeyed, FaultSwitches::default(), sim_stop.clone()));
    let dispatch = || -> anyhow::Result<Dispatch> {
        let config = DispatcherConfig { idle_wait: Duration::from_millis(20), ..DispatcherConfig::new(Capabilities::unkeyed()) };
        Ok(Dispatch { client: ProviderClient::new(&provider, Duration::from_secs(5))?, config })
    };

    let faults = race_point();
    let wiring = Wiring {
        db: db.clone(),
        kafka: KafkaConfig::new(kafka.bootstrap_servers()),
        topics: topics.clone(),
        group_prefix: unique("herald"),
        artifacts: artifacts.clone(),
        tokens: Tokens::single("t", "alice"),
    };
    let roles = Roles { api: None, relay: true, worker: true, subscriptions: true, dispatcher: true };
    let options = RoleOptions { faults: faults.clone(), dispatch: Some(dispatch()?), ..RoleOptions::default() };
    let running = pipeline::start_roles(wiring, roles, options).await?;
    let second = dispatch()?;
    let second_dispatcher = Dispatcher::new(db.clone(), second.client, second.config, Hook::none());
    let stop_second = CancellationToken::new();
    let second_run = tokio::spawn({
        let stop = stop_second.clone();
        async move { second_dispatcher.run(stop).await }
    });

    let request = ExportRequest { format: Format::Csv, query: "overdue work item".into() };
    let job_id = jobs::submit(&db, &IntakeConfig::new(topics.clone()), "alice", "k-000", &request).await?.job().job_id.clone();
    // Entry two: the same processor, handed the job directly. It waits at the
    // gate until entry one (the command through Kafka) arrives there too.
    let direct = ExportWorker::new(db.clone(), topics, ArtifactStore::from_location(&artifacts)?, LeasePolicy::default(), faults);
    let outcome = tokio::time::timeout(Duration::from_secs(120), direct.handle(&job_id)).await??;
    assert!(matches!(outcome, Outcome::Completed { .. } | Outcome::Skipped), "{outcome:?}");
    settle(&db, &job_id).await?;
    stop_second.cancel();
    second_run.await?;
    running.stop().await?;

    let job = jobs::get_any(&db, &job_id).await?.expect("job");
    assert_eq!((job.status.as_str(), job.attempts, job.generation), ("succeeded", 1, 1), "one entry point won the start");
    assert_eq!(count(&db, COMPLETIONS, &job_id).await?, 1, "one completion event");
    assert_eq!(count(&db, INTENTS, &job_id).await?, 1, "one notification intent");
    assert_eq!(count(&db, SENT, &job_id).await?, 1);
    let totals = ledger.totals().await?;
    assert_eq!((totals.effects, totals.requests), (1, 1), "the user was notified exactly once");
    sim_stop.cancel();
    Ok(())
}

on_both!(seed_000_two_entry_points_one_notification, two_entry_points_one_notification);
