//! Only a claim holder calls the provider (invariant 9), forced rather than
//! hoped for: a paused provider holds the first call of a two-intent batch
//! until the second intent's batch claim has less than a call timeout left,
//! then holds that second call past the batch claim's original expiry while
//! a second dispatcher tries to take it over. The provider reads the claim
//! from the database when each call arrives and again when it answers.
//!
//! Without the renew before each call the second call would run on a claim
//! that expires under it: the second dispatcher would then call again
//! (keyed: two calls) or mark a delivered intent `unknown` (unkeyed).

#[macro_use]
mod notify_support;

use std::time::Duration;

use herald_notify::claims;
use herald_notify::provider::Capabilities;
use notify_support::{Backend, TestProvider, database, dispatcher, row, seed, until_db_time};
use tokio_util::sync::CancellationToken;

const LEASE: Duration = Duration::from_secs(8);
const TIMEOUT: Duration = Duration::from_secs(6);
/// The first call is answered when the second intent's batch claim has this
/// much left: less than a call timeout (so an unrenewed call would outlive
/// it), more than lease − timeout (so the first call does not time out).
const LEFT_WHEN_REACHED_MS: i64 = 4_000;

async fn only_a_claim_holder_calls(backend: Backend, keyed: bool) -> anyhow::Result<()> {
    let (test_db, db) = database(backend).await?;
    seed(&db, "ntf_first", 1).await?;
    seed(&db, "ntf_second", 2).await?;
    let provider = TestProvider::start(&test_db.url, keyed, true).await?;
    let caps = if keyed { Capabilities::keyed(Duration::from_secs(3600)) } else { Capabilities::unkeyed() };
    // Each dispatcher has its own pool, as separate processes would.
    let (db_a, db_b) = (herald_store::Db::connect(&test_db.url).await?, herald_store::Db::connect(&test_db.url).await?);
    let a = dispatcher(&db_a, &provider.url, caps.clone(), LEASE, TIMEOUT, 2)?;
    let b = dispatcher(&db_b, &provider.url, caps, LEASE, TIMEOUT, 2)?;
    let stop = CancellationToken::new();
    let run_a = tokio::spawn({
        let stop = stop.clone();
        async move { a.dispatch_once(&stop).await }
    });

    assert_eq!(provider.next_arrival().await?, "ntf_first");
    let batch_expiry = row(&db, "ntf_second").await?.claim_expires_at_ms.expect("the batch claimed both");
    until_db_time(&db, batch_expiry - LEFT_WHEN_REACHED_MS).await?;
    provider.release_one();
    assert_eq!(provider.next_arrival().await?, "ntf_second");

    // The batch claim's original lease is over; the second call is still held.
    until_db_time(&db, batch_expiry).await?;
    let run_b = tokio::spawn({
        let stop = stop.clone();
        async move { b.dispatch_once(&stop).await }
    });
    let b_took_over = tokio::select! {
        done = run_b => done??,
        key = provider.next_arrival() => anyhow::bail!("a second dispatcher called for {} while the first held it", key?),
    };
    provider.open();
    let a_recorded = tokio::time::timeout(Duration::from_secs(30), run_a).await???;

    assert_eq!((a_recorded, b_took_over), (2, 0), "the holder recorded both; nothing was free to take over");
    let calls = provider.calls();
    assert_eq!(calls.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(), ["ntf_first", "ntf_second"], "one call per intent");
    for call in &calls {
        assert!(call.at_arrival.live && call.at_arrival.token.is_some(), "{}: claim not live when the call arrived: {call:?}", call.key);
        assert_eq!(call.at_answer.as_ref(), Some(&call.at_arrival), "{}: claim lost or changed before the answer", call.key);
    }
    for key in ["ntf_first", "ntf_second"] {
        let intent = row(&db, key).await?;
        assert_eq!((intent.status.as_str(), intent.attempts), ("sent", 1), "{key}: delivered, never `unknown`: {intent:?}");
        assert_eq!(provider.effects_of(key).await?, 1, "{key}: one provider effect");
    }
    Ok(())
}

async fn keyed(backend: Backend) -> anyhow::Result<()> {
    only_a_claim_holder_calls(backend, true).await
}

async fn unkeyed(backend: Backend) -> anyhow::Result<()> {
    only_a_claim_holder_calls(backend, false).await
}

on_both!(only_a_claim_holder_calls_keyed, keyed);
on_both!(only_a_claim_holder_calls_unkeyed, unkeyed);

/// The conditional renew itself: it extends a live claim by a whole lease on
/// the database's clock, and refuses an expired claim — even one nobody took
/// yet — and a claim that was taken over.
async fn renew_before_call(backend: Backend) -> anyhow::Result<()> {
    let (_test_db, db) = database(backend).await?;
    seed(&db, "ntf_renew", 1).await?;
    let [mine] = <[_; 1]>::try_from(claims::claim(&db, "a", 60_000, 10).await?).map_err(|v| anyhow::anyhow!("{v:?}"))?;
    assert_eq!(mine.attempts, 0, "claiming is not an attempt");
    let before = notify_support::db_now(&db).await?;
    let start = claims::begin_call(&db, &mine, 60_000).await?.expect("live claim renewed");
    assert_eq!(start.attempts, 1);
    let renewed = row(&db, "ntf_renew").await?;
    assert!(renewed.claim_expires_at_ms.is_some_and(|e| e >= before + 60_000), "a whole lease from the renewal: {renewed:?}");
    assert!(renewed.first_attempt_at_ms.is_some_and(|f| f >= before));

    sqlx::query(&format!("UPDATE notification_intents SET claim_expires_at_ms = {} - 1", db.now_sql())).execute(db.pool()).await?;
    assert!(claims::begin_call(&db, &mine, 60_000).await?.is_none(), "expired: no call, though nobody took it yet");

    let [theirs] = <[_; 1]>::try_from(claims::claim(&db, "b", 60_000, 10).await?).map_err(|v| anyhow::anyhow!("{v:?}"))?;
    assert!(theirs.may_have_executed, "the expired claim had begun a call that never finished");
    assert!(claims::begin_call(&db, &mine, 60_000).await?.is_none(), "taken over: the old token calls nothing");
    assert!(claims::begin_call(&db, &theirs, 60_000).await?.is_some());
    Ok(())
}

on_both!(renew_refuses_expired_and_taken_claims, renew_before_call);

/// A batch claim that expires before the dispatcher reached an intent leaves
/// nothing behind: the next holder takes it over as a first attempt.
async fn unreached_claim_is_clean(backend: Backend) -> anyhow::Result<()> {
    let (_test_db, db) = database(backend).await?;
    seed(&db, "ntf_unreached", 1).await?;
    claims::claim(&db, "a", 1, 10).await?;
    until_db_time(&db, row(&db, "ntf_unreached").await?.claim_expires_at_ms.unwrap_or_default()).await?;
    let [taken] = <[_; 1]>::try_from(claims::claim(&db, "b", 60_000, 10).await?).map_err(|v| anyhow::anyhow!("{v:?}"))?;
    assert!(!taken.may_have_executed, "no call had begun under the expired claim");
    assert_eq!((taken.attempts, taken.first_attempt_at_ms), (0, None));
    Ok(())
}

on_both!(unreached_claim_is_taken_over_clean, unreached_claim_is_clean);
