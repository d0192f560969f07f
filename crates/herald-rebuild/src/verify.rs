//! Verification: two generations that saw the same events hold the same
//! documents. Both are read in one snapshot, and live traffic writes both in
//! the same transaction, so no in-flight batch can make them differ.

use herald_store::{Backend, Db, StoreError};
use sha2::{Digest, Sha256};
use sqlx::Row;

/// What a generation holds: document and tombstone counts and a checksum
/// over (job_id, version, tombstone) in job order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    /// Live documents (what reads can find).
    pub documents: i64,
    /// Tombstones of deleted jobs.
    pub tombstones: i64,
    pub checksum: String,
}

/// Fingerprints of `a` and `b`, read in one snapshot.
pub async fn fingerprints(db: &Db, a: i64, b: i64) -> Result<(Fingerprint, Fingerprint), StoreError> {
    let mut tx = db.begin().await?;
    if db.backend() == Backend::Postgres {
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY").execute(&mut *tx).await?;
    }
    let mut out = Vec::with_capacity(2);
    for generation in [a, b] {
        let rows = sqlx::query("SELECT job_id, version, deleted_at_ms FROM search_documents WHERE generation = $1 ORDER BY job_id")
            .bind(generation)
            .fetch_all(&mut *tx)
            .await?;
        let mut hash = Sha256::new();
        let mut tombstones = 0;
        for row in &rows {
            let job_id: String = row.try_get("job_id")?;
            let version: i64 = row.try_get("version")?;
            let deleted: Option<i64> = row.try_get("deleted_at_ms")?;
            tombstones += i64::from(deleted.is_some());
            hash.update(job_id.as_bytes());
            hash.update([0]);
            hash.update(version.to_be_bytes());
            hash.update([u8::from(deleted.is_some())]);
        }
        let documents = rows.len() as i64 - tombstones;
        out.push(Fingerprint { documents, tombstones, checksum: hash.finalize().iter().map(|b| format!("{b:02x}")).collect() });
    }
    tx.commit().await?;
    let b = out.pop().expect("two");
    let a = out.pop().expect("two");
    Ok((a, b))
}
