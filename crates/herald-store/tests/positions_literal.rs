//! A live batch's first round trip on PostgreSQL's native driver
//! (`positions::begin_advancing`): `BEGIN` and the positions upsert as one
//! simple query, names as literals. A name with quotes and backslashes
//! lands as itself; positions never go back; the upsert is in the
//! transaction (a rollback leaves nothing).

use std::collections::BTreeMap;

use herald_store::{Db, positions};
use sqlx::postgres::PgPoolOptions;

#[tokio::test]
async fn begin_advancing_stores_names_as_given_and_never_goes_back() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let pool = PgPoolOptions::new().max_connections(1).connect(&test_db.url).await?;
    let name = r"o'brien\x\'; DROP TABLE inbox; --";
    let topic = "t'\\";

    let tx = positions::begin_advancing(&pool, name, &BTreeMap::from([(topic, BTreeMap::from([(0, 10), (1, 4)]))])).await?;
    tx.commit().await?;
    assert_eq!(positions::read(&db, name, topic).await?, BTreeMap::from([(0, 10), (1, 4)]));

    // Partition 0 behind what is stored (a redelivery): it stays at 10.
    let tx = positions::begin_advancing(&pool, name, &BTreeMap::from([(topic, BTreeMap::from([(0, 7), (1, 6)]))])).await?;
    tx.commit().await?;
    assert_eq!(positions::read(&db, name, topic).await?, BTreeMap::from([(0, 10), (1, 6)]));

    let tx = positions::begin_advancing(&pool, name, &BTreeMap::from([(topic, BTreeMap::from([(1, 99)]))])).await?;
    tx.rollback().await?;
    assert_eq!(positions::read(&db, name, topic).await?, BTreeMap::from([(0, 10), (1, 6)]), "rolled back with its transaction");

    let refused = positions::begin_advancing(&pool, "a\0b", &BTreeMap::from([(topic, BTreeMap::from([(0, 1)]))])).await;
    assert!(refused.is_err(), "a NUL cannot be stored");
    pool.close().await;
    Ok(())
}
