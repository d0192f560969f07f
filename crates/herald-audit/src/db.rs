//! The database's side of the evidence, read in one snapshot.

use herald_store::{Backend, Db};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::AuditError;
use crate::model::{ArtifactRow, DbEvidence, InboxRow, Intent, Job, OutboxRow, SearchDocument};

/// Reads every table the checks compare, in one transaction (repeatable read
/// on PostgreSQL), so the tables agree with each other.
pub async fn read(db: &Db) -> Result<DbEvidence, AuditError> {
    let mut tx = db.begin().await?;
    let commit_order = match db.backend() {
        Backend::Postgres => {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY").execute(&mut *tx).await?;
            // The relay publishes a slice in (xid, seq) order, and for rows of
            // one key that is their commit order: see ARCHITECTURE.md.
            "xid, seq"
        }
        Backend::Sqlite => "seq",
    };
    let sql = format!("SELECT seq, source, event_id, event_type, subject, topic, partition_key, status FROM outbox ORDER BY {commit_order}");
    let outbox = sqlx::query(&sql)
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .enumerate()
    .map(|(rank, r)| outbox_row(rank, r))
    .collect::<Result<_, sqlx::Error>>()?;
    let inbox = sqlx::query("SELECT subscription, source, event_id FROM inbox")
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| Ok(InboxRow { subscription: r.try_get("subscription")?, source: r.try_get("source")?, event_id: r.try_get("event_id")? }))
        .collect::<Result<_, sqlx::Error>>()?;
    let jobs = sqlx::query("SELECT job_id, caller, status, result_id FROM export_jobs")
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| Ok(Job { job_id: r.try_get("job_id")?, caller: r.try_get("caller")?, status: r.try_get("status")?, result_id: r.try_get("result_id")? }))
        .collect::<Result<_, sqlx::Error>>()?;
    let active_generation: i64 =
        sqlx::query("SELECT generation FROM active_generations WHERE projection = 'search'").fetch_one(&mut *tx).await?.try_get("generation")?;
    let search_documents = sqlx::query("SELECT job_id, caller, result_id FROM search_documents WHERE generation = $1")
        .bind(active_generation)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| Ok(SearchDocument { job_id: r.try_get("job_id")?, caller: r.try_get("caller")?, result_id: r.try_get("result_id")? }))
        .collect::<Result<_, sqlx::Error>>()?;
    let artifacts = sqlx::query("SELECT result_id, job_id FROM export_artifacts")
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| Ok(ArtifactRow { result_id: r.try_get("result_id")?, job_id: r.try_get("job_id")? }))
        .collect::<Result<_, sqlx::Error>>()?;
    let intents = sqlx::query("SELECT idempotency_key, status FROM notification_intents")
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| Ok(Intent { key: r.try_get("idempotency_key")?, status: r.try_get("status")? }))
        .collect::<Result<_, sqlx::Error>>()?;
    tx.rollback().await?;
    Ok(DbEvidence { outbox, inbox, jobs, active_generation, search_documents, artifacts, intents })
}

fn outbox_row(rank: usize, r: &AnyRow) -> Result<OutboxRow, sqlx::Error> {
    Ok(OutboxRow {
        seq: r.try_get("seq")?,
        commit_rank: rank,
        source: r.try_get("source")?,
        event_id: r.try_get("event_id")?,
        event_type: r.try_get("event_type")?,
        subject: r.try_get("subject")?,
        topic: r.try_get("topic")?,
        partition_key: r.try_get("partition_key")?,
        status: r.try_get("status")?,
    })
}
