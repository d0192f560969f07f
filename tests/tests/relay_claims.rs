//! Claims on slices (owner, token, lease, attempts), on PostgreSQL and SQLite: two relays
//! claiming at the same instant get disjoint slices; progress is written
//! only with the current token and an unexpired lease; release keeps the
//! cursor for the next holder.

use herald_relay::claims::{self as store, Cursor, Fence, SLICES};
use herald_store::Db;
use herald_testkit::Gate;

async fn dbs(postgres: bool) -> anyhow::Result<(herald_testkit::TestDb, Db, Db)> {
    let test_db = if postgres { herald_testkit::postgres_db().await? } else { herald_testkit::sqlite_db()? };
    let a = Db::connect_and_migrate(&test_db.url).await?;
    // A second pool, as a second relay process has.
    let b = Db::connect(&test_db.url).await?;
    Ok((test_db, a, b))
}

async fn racing_claims_are_disjoint(postgres: bool) -> anyhow::Result<()> {
    let (_keep, a, b) = dbs(postgres).await?;
    let gate = Gate::new(2);
    let claim = |db: Db, owner: &'static str, gate: Gate| async move {
        gate.arrive_and_wait().await;
        store::claim(&db, owner, 60_000, i64::from(SLICES)).await
    };
    let (got_a, got_b) = tokio::try_join!(claim(a.clone(), "a", gate.clone()), claim(b.clone(), "b", gate.clone()))?;
    let mut all: Vec<i32> = got_a.iter().chain(&got_b).map(|c| c.slice).collect();
    all.sort_unstable();
    let before = all.len();
    all.dedup();
    assert_eq!(all.len(), before, "no slice claimed twice: a={got_a:?} b={got_b:?}");
    assert_eq!(all, (0..SLICES).collect::<Vec<_>>(), "every free slice was claimed once");
    // Nothing is left to claim while the leases run.
    assert!(store::claim(&a, "c", 60_000, 16).await?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn racing_claims_are_disjoint_postgres() -> anyhow::Result<()> {
    racing_claims_are_disjoint(true).await
}

#[tokio::test(flavor = "multi_thread")]
async fn racing_claims_are_disjoint_sqlite() -> anyhow::Result<()> {
    racing_claims_are_disjoint(false).await
}

async fn progress_is_fenced(postgres: bool) -> anyhow::Result<()> {
    let (_keep, a, _b) = dbs(postgres).await?;
    let claim = store::claim(&a, "a", 60_000, 1).await?.remove(0);
    assert_eq!(claim.attempt_count, 1);
    let next = Cursor { seq: 5, ..claim.cursor.clone() };
    assert_eq!(store::record_progress(&a, &claim, &next, &[], &[], 60_000).await?, Fence::Held);

    let forged = store::Claim { token: "not-the-token".into(), ..claim.clone() };
    let regress = Cursor { seq: 1, ..claim.cursor.clone() };
    assert_eq!(store::record_progress(&a, &forged, &regress, &[], &[], 60_000).await?, Fence::Lost);

    // The lease runs out: even the right token may not write any more.
    sqlx::query("UPDATE relay_slices SET claim_expires_at_ms = 0 WHERE slice = $1").bind(claim.slice).execute(a.pool()).await?;
    assert_eq!(store::record_progress(&a, &claim, &regress, &[], &[], 60_000).await?, Fence::Lost);
    assert!(store::renew(&a, std::slice::from_ref(&claim), 60_000).await?.is_empty(), "an expired lease is not renewed");

    // A new claim of the same slice is a new token and a higher count, and
    // goes on from the last recorded cursor.
    let again = store::claim(&a, "a", 60_000, 1).await?.remove(0);
    assert_eq!(again.slice, claim.slice);
    assert_ne!(again.token, claim.token);
    assert_eq!(again.attempt_count, 2);
    assert_eq!(again.cursor.seq, 5);
    assert!(store::release(&a, &again).await?);
    let after = store::claim(&a, "b", 60_000, 1).await?.remove(0);
    assert_eq!((after.slice, after.cursor.seq), (claim.slice, 5), "a released slice is free at once, cursor kept");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn progress_needs_the_current_token_and_an_unexpired_lease_postgres() -> anyhow::Result<()> {
    progress_is_fenced(true).await
}

#[tokio::test(flavor = "multi_thread")]
async fn progress_needs_the_current_token_and_an_unexpired_lease_sqlite() -> anyhow::Result<()> {
    progress_is_fenced(false).await
}

mod relay_support;

use std::time::Duration;

use relay_support::{bench, config, stat, wait_until};

async fn owners(db: &Db) -> anyhow::Result<std::collections::BTreeMap<String, usize>> {
    let mut by_owner = std::collections::BTreeMap::new();
    for claim in store::slices(db).await? {
        *by_owner.entry(claim.owner).or_default() += 1;
    }
    Ok(by_owner)
}

#[tokio::test(flavor = "multi_thread")]
async fn relays_share_the_slices_and_give_them_back_when_they_stop() -> anyhow::Result<()> {
    let b = bench(true).await?;
    // Long leases, frequent rebalancing: a slice that changes hands before
    // its lease could run out was handed over, not abandoned.
    let fast = |owner: &str| relay_support::RelayConfig {
        renew_every: Duration::from_millis(300),
        ..config(owner).with_lease(Duration::from_secs(20))
    };
    let a = b.start(fast("relay-a"))?;
    wait_until("A holds every slice", || async { Ok(stat(&a.stats.claims) == 16) }).await?;
    // A second relay joins: A gives back its surplus and B takes it.
    let second = b.start_on(Db::connect(&b.test_db.url).await?, fast("relay-b"))?;
    wait_until("an even split", || async {
        let by_owner = owners(&b.db).await?;
        Ok(by_owner.get("relay-a") == Some(&8) && by_owner.get("relay-b") == Some(&8))
    })
    .await?;
    let b_leases: Vec<(i32, i64)> =
        sqlx::query_as("SELECT slice, claim_expires_at_ms FROM relay_slices WHERE claim_owner = 'relay-b'").fetch_all(b.db.pool()).await?;
    // B stops cleanly: it releases its claims and leaves the membership, so
    // A takes everything back long before B's leases would have run out.
    second.stop().await?;
    wait_until("A holds every slice again", || async { Ok(owners(&b.db).await?.get("relay-a") == Some(&16)) }).await?;
    for (slice, b_expiry) in b_leases {
        let (claimed_at,): (i64,) =
            sqlx::query_as("SELECT claimed_at_ms FROM relay_slices WHERE slice = $1").bind(slice).fetch_one(b.db.pool()).await?;
        assert!(claimed_at < b_expiry, "slice {slice} was released by B, not taken after its lease expired");
    }
    a.stop().await?;
    assert_eq!(owners(&b.db).await?.get(""), Some(&16), "nothing held after a clean stop");
    let members = sqlx::query("SELECT COUNT(*) AS n FROM relay_members").fetch_one(b.db.pool()).await?;
    assert_eq!(sqlx::Row::try_get::<i64, _>(&members, "n")?, 0);
    Ok(())
}
