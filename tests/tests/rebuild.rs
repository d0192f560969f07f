//! A rebuild of the search projection during live traffic: generation 2 is
//! replayed from retained history, catches up, verifies against generation 1
//! and takes over reads; queries during all of it never see an empty or
//! partial result; the notification simulator counts no new notification;
//! rollback returns reads to generation 1.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{ALICE, Broker, Database, export_body};
use herald::pipeline::{self, Dispatch, RoleOptions, Roles};
use herald_notify::dispatcher::DispatcherConfig;
use herald_notify::provider::{Capabilities, ProviderClient};
use herald_proof::sim::{self, FaultSwitches, Ledger, SimConfig};
use herald_rebuild::replay::ReplayProgress;
use herald_rebuild::{Progress, RebuildOptions, Search, SwitchMode, generations, rebuild, verify};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

struct Quiet;

impl Progress for Quiet {
    fn phase(&mut self, _: &str) {}
    fn replayed(&mut self, _: ReplayProgress) {}
}

async fn provider_effects(url: &str) -> anyhow::Result<i64> {
    let totals: Value = reqwest::get(format!("{url}/effects")).await?.json().await?;
    Ok(totals["effects"].as_i64().unwrap_or(-1))
}

async fn wait_effects(url: &str, n: i64) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while provider_effects(url).await? < n {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "notifications never reached {n}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn rebuild_during_live_traffic_switches_without_side_effects() -> anyhow::Result<()> {
    let stack = common::start(Database::Postgres, Broker::Mock).await?;
    let ledger_dir = tempfile::tempdir()?;
    let ledger = Ledger::open(&ledger_dir.path().join("ledger.sqlite").display().to_string()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let provider = format!("http://{}", listener.local_addr()?);
    let sim_stop = CancellationToken::new();
    tokio::spawn(sim::serve(listener, ledger, SimConfig::keyed(Duration::from_secs(3600)), FaultSwitches::default(), sim_stop.clone()));
    let dispatch = Dispatch {
        client: ProviderClient::new(&provider, Duration::from_secs(5))?,
        config: DispatcherConfig {
            idle_wait: Duration::from_millis(20),
            ..DispatcherConfig::new(Capabilities::keyed(Duration::from_secs(3600)))
        },
    };
    let dispatcher = pipeline::start_roles(
        stack.wiring.clone(),
        Roles { api: None, relay: false, worker: false, subscriptions: false, dispatcher: true },
        RoleOptions { dispatch: Some(dispatch), ..RoleOptions::default() },
    )
    .await?;

    for i in 0..20 {
        let (status, _, _) =
            stack.post_export(ALICE, Some(&format!("before-{i}")), &export_body("csv", &format!("rebuild before {i}"))).await?;
        assert_eq!(status, 202);
    }
    stack.wait_for_hits(ALICE, "rebuild", 20).await?;
    wait_effects(&provider, 20).await?;

    // Live traffic and readers while the rebuild runs.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let (http, base, stop) = (stack.http.clone(), stack.base.clone(), stop.clone());
        tokio::spawn(async move {
            let mut sent = 0;
            while !stop.load(Ordering::SeqCst) && sent < 15 {
                let body = export_body("json", &format!("rebuild during {sent}"));
                common::post_export(&http, &base, ALICE, Some(&format!("during-{sent}")), &body).await?;
                sent += 1;
            }
            anyhow::Ok(sent)
        })
    };
    let readers = {
        let (http, base, stop) = (stack.http.clone(), stack.base.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut reads, mut generations_seen) = (0, std::collections::BTreeSet::new());
            while !stop.load(Ordering::SeqCst) {
                let answer: Value =
                    http.get(format!("{base}/v1/search?q=rebuild%20before")).bearer_auth(ALICE).send().await?.json().await?;
                let hits = answer["hits"].as_array().map_or(0, Vec::len);
                anyhow::ensure!(hits == 20, "a read during the rebuild saw {hits} of the 20 earlier exports: {answer}");
                generations_seen.insert(answer["generation"].as_i64().unwrap_or(-1));
                reads += 1;
            }
            anyhow::Ok((reads, generations_seen))
        })
    };

    let options = RebuildOptions {
        kafka: stack.wiring.kafka.clone(),
        topic: stack.wiring.topics.events.clone(),
        switch: SwitchMode::Auto,
        offline: false,
        dry_run: false,
        batch: 7,
        ..RebuildOptions::default()
    };
    let report = rebuild::rebuild(&stack.db, &Search, &options, &mut Quiet, &CancellationToken::new()).await?;
    assert_eq!((report.generation, report.previous_active, report.state.as_str(), report.switched), (2, 1, "active", true), "{report:?}");
    assert!(report.replayed >= 20, "{report:?}");

    let sent = traffic.await??;
    stop.store(true, Ordering::SeqCst);
    let (reads, seen) = readers.await??;
    assert!(reads > 0);
    assert!(seen.iter().all(|g| *g == 1 || *g == 2), "{seen:?}");

    // Everything that arrived meanwhile is in the new generation, which
    // agrees with the old one document for document.
    let total = 20 + sent;
    let found = stack.wait_for_hits(ALICE, "rebuild", total).await?;
    assert_eq!(found["generation"], 2);
    let settled = wait_agree(&stack.db, total as i64).await?;
    assert!(settled, "generations 1 and 2 hold the same documents");
    wait_effects(&provider, total as i64).await?;
    assert_eq!(provider_effects(&provider).await?, total as i64, "the replay sent no notification");

    // Rollback: reads return to generation 1, which kept up with live traffic.
    assert_eq!(generations::rollback(&stack.db, "search").await?, 1);
    let (_, answer) = stack.get(ALICE, "/v1/search?q=rebuild").await?;
    assert_eq!(answer["generation"], 1);
    assert_eq!(answer["hits"].as_array().map(Vec::len), Some(total));

    dispatcher.stop().await?;
    sim_stop.cancel();
    stack.stop().await
}

/// Waits until both generations hold `n` documents, then compares them.
async fn wait_agree(db: &herald_store::Db, n: i64) -> anyhow::Result<bool> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (one, two) = verify::fingerprints(db, &Search, 1, 2).await?;
        if one.rows >= n && two.rows >= n {
            return Ok(one == two);
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "documents: {} and {}", one.rows, two.rows);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
