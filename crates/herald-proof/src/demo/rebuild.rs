//! The demo's rebuild: search generation N+1 replayed from the events topic
//! beside the active one, verified against it and switched in one
//! transaction — while the notify subscription and dispatcher keep running,
//! so a replay that reached notifications would show up as new intents or
//! provider effects.

use herald_rebuild::replay::{DEFAULT_BATCH, ReplayProgress};
use herald_rebuild::{Progress, RebuildOptions, Search, SwitchMode, generations};
use herald_status::counts;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::report::Check;
use herald_wiring::pipeline::Wiring;

struct Quiet;

impl Progress for Quiet {
    fn phase(&mut self, _: &str) {}
    fn replayed(&mut self, _: ReplayProgress) {}
}

/// The receiver's requests and effects so far.
async fn provider_totals(url: &str) -> anyhow::Result<(i64, i64)> {
    let totals: Value = reqwest::get(format!("{url}/effects")).await?.json().await?;
    Ok((totals["requests"].as_i64().unwrap_or(-1), totals["effects"].as_i64().unwrap_or(-1)))
}

pub async fn rebuild_and_switch(wiring: &Wiring, provider_url: &str, n: i64) -> anyhow::Result<Vec<Check>> {
    let db = &wiring.db;
    let before = generations::active(db, "search").await?;
    let intents_before = counts::collect(db).await?.intents.total();
    let effects_before = provider_totals(provider_url).await?;
    let options = RebuildOptions {
        kafka: wiring.kafka.clone(),
        topic: wiring.topics.events.clone(),
        switch: SwitchMode::Auto,
        offline: false,
        dry_run: false,
        batch: DEFAULT_BATCH,
        from_snapshot: None,
        ..RebuildOptions::default()
    };
    let report = herald_rebuild::rebuild::rebuild(db, &Search, &options, &mut Quiet, &CancellationToken::new()).await?;
    let after = generations::active(db, "search").await?;
    let intents_after = counts::collect(db).await?.intents.total();
    let effects_after = provider_totals(provider_url).await?;
    Ok(vec![
        Check::new(
            "rebuild replayed history into a new generation",
            report.generation == before + 1 && report.replayed >= u64::try_from(n).unwrap_or(u64::MAX),
            format!(
                "generation {}: {} records replayed below its boundary, the rest is live traffic's",
                report.generation, report.replayed
            ),
        ),
        Check::new(
            "rebuild verified and switched reads",
            report.switched && after == report.generation && report.documents == Some(n),
            format!("active {before} → {after}, {} documents verified equal", report.documents.unwrap_or(0)),
        ),
        Check::new(
            "replay sent no notification",
            intents_after == intents_before && effects_after == effects_before,
            format!("{intents_before} → {intents_after} intents, {} → {} provider requests", effects_before.0, effects_after.0),
        ),
    ])
}
