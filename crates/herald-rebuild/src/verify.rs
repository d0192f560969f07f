//! Verification. Online: two generations that own the same records hold the
//! same rows, compared by their projection's fingerprint in one snapshot
//! (live traffic writes both in the same transaction, so no in-flight batch
//! can make them differ). Offline: the projection's own source of truth.

use herald_consumer::{Fingerprint, Projection};
use herald_store::{Backend, Db, StoreError};

/// Fingerprints of generations `a` and `b` of `projection`, read in one snapshot.
pub async fn fingerprints<P: Projection>(db: &Db, projection: &P, a: i64, b: i64) -> Result<(Fingerprint, Fingerprint), StoreError> {
    let mut tx = db.begin().await?;
    if db.backend() == Backend::Postgres {
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY").execute(&mut *tx).await?;
    }
    let first = projection.fingerprint(&mut tx, a).await?;
    let second = projection.fingerprint(&mut tx, b).await?;
    tx.commit().await?;
    Ok((first, second))
}
