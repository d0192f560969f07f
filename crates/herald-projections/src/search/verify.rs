//! Checking a generation: its fingerprint (to compare two generations read
//! in one snapshot) and its agreement with the jobs table, the projection's
//! source of truth, for a rebuild that has no live generation at the same
//! point to compare with (offline).

use std::collections::{BTreeMap, BTreeSet};

use herald_consumer::Fingerprint;
use herald_store::delivered::Settled;
use herald_store::{Db, StoreError, Tx};
use sha2::{Digest, Sha256};
use sqlx::Row;

/// Document and tombstone counts and a checksum over (job_id, version,
/// tombstone) in job order. Tombstones below the prune horizon are left
/// out: a prune may have removed them from one generation while a replay of
/// retained records wrote them into the other, and either way they hide no
/// document. Documents are all counted, so one a late record brought back
/// still shows as a difference.
pub(super) async fn fingerprint(tx: &mut Tx<'_>, generation: i64) -> Result<Fingerprint, StoreError> {
    let horizons = herald_store::prune::horizons(tx).await?;
    let rows = sqlx::query("SELECT job_id, version, deleted_at_ms FROM search_documents WHERE generation = $1 ORDER BY job_id")
        .bind(generation)
        .fetch_all(&mut **tx)
        .await?;
    let mut hash = Sha256::new();
    let (mut tombstones, mut counted) = (0, 0);
    for row in &rows {
        let job_id: String = row.try_get("job_id")?;
        let version: i64 = row.try_get("version")?;
        let deleted: Option<i64> = row.try_get("deleted_at_ms")?;
        if deleted.is_some_and(|at| horizons.below(herald_store::prune::Kind::Tombstones, at)) {
            continue;
        }
        counted += 1;
        tombstones += i64::from(deleted.is_some());
        hash.update(job_id.as_bytes());
        hash.update([0]);
        hash.update(version.to_be_bytes());
        hash.update([u8::from(deleted.is_some())]);
    }
    let checksum = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(Fingerprint { rows: counted - tombstones, other: tombstones, checksum })
}

/// A row of the generation as the check needs it.
struct Doc {
    caller: String,
    result_id: String,
    tombstone: bool,
}

/// A job as the check needs it.
struct Job {
    caller: String,
    status: String,
    result_id: Option<String>,
}

/// What `generation` must agree with, from the jobs table and the outbox:
/// every job whose completion (deletion) was delivered by the time
/// `settled` was taken — so its record is below the boundary — has a row
/// (a tombstone); every document is a succeeded (or since deleted) job's,
/// with its result and caller; every tombstone is a deleted job's. Facts
/// delivered later may or may not be in: either is right.
pub(super) async fn against_jobs(db: &Db, generation: i64, settled: &Settled) -> Result<Vec<String>, StoreError> {
    let mut tx = db.begin().await?;
    let docs: BTreeMap<String, Doc> =
        sqlx::query("SELECT job_id, caller, result_id, deleted_at_ms FROM search_documents WHERE generation = $1")
            .bind(generation)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| {
                let deleted: Option<i64> = r.try_get("deleted_at_ms")?;
                Ok((
                    r.try_get("job_id")?,
                    Doc { caller: r.try_get("caller")?, result_id: r.try_get("result_id")?, tombstone: deleted.is_some() },
                ))
            })
            .collect::<Result<_, sqlx::Error>>()?;
    let jobs: BTreeMap<String, Job> = sqlx::query("SELECT job_id, caller, status, result_id FROM export_jobs")
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| {
            Ok((
                r.try_get("job_id")?,
                Job { caller: r.try_get("caller")?, status: r.try_get("status")?, result_id: r.try_get("result_id")? },
            ))
        })
        .collect::<Result<_, sqlx::Error>>()?;
    let sql = format!("SELECT DISTINCT subject FROM outbox WHERE event_type = $1 AND {}", settled.outbox_filter(db.backend()));
    let completed = subjects(&mut tx, &sql, "herald.export.completed").await?;
    let deleted = subjects(&mut tx, &sql, "herald.export.deleted").await?;
    tx.commit().await?;
    Ok(problems(generation, &docs, &jobs, &completed, &deleted))
}

async fn subjects(tx: &mut Tx<'_>, sql: &str, event_type: &str) -> Result<BTreeSet<String>, StoreError> {
    let rows = sqlx::query(sql).bind(event_type).fetch_all(&mut **tx).await?;
    Ok(rows.iter().map(|r| r.try_get(0)).collect::<Result<_, _>>()?)
}

fn problems(
    generation: i64,
    docs: &BTreeMap<String, Doc>,
    jobs: &BTreeMap<String, Job>,
    completed: &BTreeSet<String>,
    deleted: &BTreeSet<String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for id in completed.iter().filter(|id| !docs.contains_key(*id)) {
        out.push(format!("job {id}: its completion was delivered before the boundary, generation {generation} has no row"));
    }
    for id in deleted.iter().filter(|id| docs.get(*id).is_some_and(|d| !d.tombstone)) {
        out.push(format!("job {id}: its deletion was delivered before the boundary, generation {generation} still has its document"));
    }
    for (id, doc) in docs {
        let Some(job) = jobs.get(id) else {
            out.push(format!("generation {generation} has a row for job {id}, which does not exist"));
            continue;
        };
        if doc.tombstone && job.status != "deleted" {
            out.push(format!("generation {generation} has a tombstone for job {id}, which is {}", job.status));
        } else if !doc.tombstone && !["succeeded", "deleted"].contains(&job.status.as_str()) {
            out.push(format!("generation {generation} has a document for job {id}, which is {}", job.status));
        } else if !doc.tombstone && (Some(&doc.result_id) != job.result_id.as_ref() || doc.caller != job.caller) {
            out.push(format!(
                "job {id}: generation {generation} says result {} of {}, the job {:?} of {}",
                doc.result_id, doc.caller, job.result_id, job.caller
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(tombstone: bool) -> Doc {
        Doc { caller: "alice".into(), result_id: if tombstone { String::new() } else { "r1".into() }, tombstone }
    }

    fn job(status: &str) -> Job {
        Job { caller: "alice".into(), status: status.into(), result_id: Some("r1".into()) }
    }

    #[test]
    fn a_generation_agrees_with_settled_facts_and_the_jobs() {
        let jobs: BTreeMap<String, Job> =
            [("a".into(), job("succeeded")), ("b".into(), job("deleted")), ("c".into(), job("succeeded"))].into();
        let docs: BTreeMap<String, Doc> = [("a".into(), doc(false)), ("b".into(), doc(true))].into();
        let completed: BTreeSet<String> = ["a".into(), "b".into()].into();
        let deleted: BTreeSet<String> = ["b".into()].into();
        assert!(problems(2, &docs, &jobs, &completed, &deleted).is_empty(), "c's completion is not settled yet: either is right");

        let missing = problems(2, &docs, &jobs, &["a".into(), "c".into()].into(), &deleted);
        assert_eq!(missing.len(), 1, "{missing:?}");
        let stale: BTreeMap<String, Doc> = [("a".into(), doc(false)), ("b".into(), doc(false))].into();
        assert_eq!(problems(2, &stale, &jobs, &completed, &deleted).len(), 1, "b was deleted before the boundary");
        let wrong: BTreeMap<String, Doc> = [("a".into(), Doc { result_id: "r9".into(), ..doc(false) }), ("z".into(), doc(false))].into();
        assert_eq!(problems(2, &wrong, &jobs, &BTreeSet::new(), &BTreeSet::new()).len(), 2, "a wrong result and a job that does not exist");
    }
}
