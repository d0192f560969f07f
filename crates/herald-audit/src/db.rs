//! The database's side of the evidence, read in one snapshot.

use herald_envelope::{EventData, ExportCompleted};
use herald_store::{Backend, Db, Tx};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::AuditError;
use crate::model::{COMPLETED, Completion, DbEvidence, DeadLetter, OutboxRow, SearchDocument};

/// Reads every table the checks compare, in one transaction (repeatable read
/// on PostgreSQL), so the tables agree with each other. Each prune horizon
/// is raised by `clock_skew_ms`: rows are dated by the clocks of the hosts
/// that wrote them, and a fact that close to a horizon is not checked.
pub async fn read(db: &Db, clock_skew_ms: i64) -> Result<DbEvidence, AuditError> {
    let mut tx = db.begin().await?;
    let commit_order = match db.backend() {
        Backend::Postgres => {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY").execute(&mut *tx).await?;
            // The relay publishes a slice in (xid, seq) order, and for rows of
            // one key that is their commit order: see ARCHITECTURE.md.
            "o.xid, o.seq"
        }
        Backend::Sqlite => "o.seq",
    };
    // A row the relay's cursor passed is delivered (herald-store's `delivered`).
    let sql = format!(
        "SELECT o.seq, o.source, o.event_id, o.event_type, o.subject, o.topic, o.partition_key, {} AS status, o.event_time_ms \
         FROM {} ORDER BY {commit_order}",
        herald_store::delivered::status_sql(db.backend()),
        herald_store::delivered::FROM_OUTBOX
    );
    let outbox = sqlx::query(&sql)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .enumerate()
        .map(|(rank, r)| outbox_row(rank, r))
        .collect::<Result<_, sqlx::Error>>()?;
    let (completions, undecodable_completions) = completions(&mut tx).await?;
    let active_generation: i64 = sqlx::query("SELECT generation FROM active_generations WHERE projection = 'search'")
        .fetch_one(&mut *tx)
        .await?
        .try_get("generation")?;
    let search_documents = sqlx::query("SELECT job_id, caller, result_id, deleted_at_ms FROM search_documents WHERE generation = $1")
        .bind(active_generation)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(search_document)
        .collect::<Result<_, sqlx::Error>>()?;
    let mut horizons = herald_store::prune::horizons(&mut tx).await?;
    for kind in crate::model::Kind::ALL {
        if let Some(h) = horizons.get(kind) {
            horizons.set(kind, h.saturating_add(clock_skew_ms));
        }
    }
    let evidence = DbEvidence {
        horizons,
        outbox,
        inbox: select(
            &mut tx,
            "SELECT subscription, source, event_id, topic, kafka_partition AS partition, kafka_offset AS \"offset\" FROM inbox",
        )
        .await?,
        jobs: select(&mut tx, "SELECT job_id, caller, status, result_id, format, query, created_at_ms, completed_at_ms FROM export_jobs").await?,
        intake_keys: select(&mut tx, "SELECT caller, operation, intent_key AS key, fingerprint, job_id FROM export_intents").await?,
        active_generation,
        search_documents,
        artifacts: select(&mut tx, "SELECT result_id, job_id FROM export_artifacts").await?,
        intents: select(&mut tx, "SELECT idempotency_key AS key, status, source, event_id, recipient, job_id FROM notification_intents").await?,
        completions,
        undecodable_completions,
        stats_counters: select(&mut tx, "SELECT day, caller, format, exports, bytes FROM stats_counters c JOIN active_generations g ON g.projection = 'stats' AND c.generation = g.generation").await?,
        dead_letters: sqlx::query(
            "SELECT id, subscription, source, event_id, topic, kafka_partition, kafka_offset, status, record_value, headers, created_at_ms \
             FROM dead_letters",
        )
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(dead_letter)
        .collect::<Result<_, sqlx::Error>>()?,
    };
    tx.rollback().await?;
    Ok(evidence)
}

/// Rows of `sql` whose column names are the fields of `T`.
async fn select<T>(tx: &mut Tx<'_>, sql: &str) -> Result<Vec<T>, AuditError>
where
    T: for<'r> sqlx::FromRow<'r, AnyRow> + Send + Unpin,
{
    Ok(sqlx::query_as::<_, T>(sql).fetch_all(&mut **tx).await?)
}

/// Completion events with their data decoded. A row that does not decode is
/// evidence too (a check names it), not a reason to stop the audit.
async fn completions(tx: &mut Tx<'_>) -> Result<(Vec<Completion>, Vec<(i64, String)>), AuditError> {
    let rows = sqlx::query("SELECT seq, source, event_id, schema_file, data, event_time_ms FROM outbox WHERE event_type = $1")
        .bind(COMPLETED)
        .fetch_all(&mut **tx)
        .await?;
    let (mut decoded, mut undecodable) = (Vec::new(), Vec::new());
    for r in &rows {
        let (schema_file, data): (String, Vec<u8>) = (r.try_get("schema_file")?, r.try_get("data")?);
        match ExportCompleted::from_avro(&schema_file, &data) {
            Ok(c) => decoded.push(Completion {
                source: r.try_get("source")?,
                event_id: r.try_get("event_id")?,
                job_id: c.job_id,
                caller: c.caller,
                format: c.format,
                completed_at_ms: c.completed_at_ms,
                size_bytes: c.size_bytes,
                event_time_ms: r.try_get("event_time_ms")?,
            }),
            Err(e) => undecodable.push((r.try_get("seq")?, e.to_string())),
        }
    }
    Ok((decoded, undecodable))
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
        event_time_ms: r.try_get("event_time_ms")?,
    })
}

fn search_document(r: &AnyRow) -> Result<SearchDocument, sqlx::Error> {
    let deleted_at: Option<i64> = r.try_get("deleted_at_ms")?;
    Ok(SearchDocument {
        job_id: r.try_get("job_id")?,
        caller: r.try_get("caller")?,
        result_id: r.try_get("result_id")?,
        tombstone: deleted_at.is_some(),
    })
}

fn dead_letter(r: &AnyRow) -> Result<DeadLetter, sqlx::Error> {
    let value: Option<Vec<u8>> = r.try_get("record_value")?;
    let headers: String = r.try_get("headers")?;
    Ok(DeadLetter {
        id: r.try_get("id")?,
        subscription: r.try_get("subscription")?,
        source: r.try_get("source")?,
        event_id: r.try_get("event_id")?,
        topic: r.try_get("topic")?,
        partition: r.try_get("kafka_partition")?,
        offset: r.try_get("kafka_offset")?,
        status: r.try_get("status")?,
        // Headers are stored as a JSON array; `[]` is a record without any.
        holds_record: value.is_some() || headers.trim() != "[]",
        created_at_ms: r.try_get("created_at_ms")?,
    })
}
