//! Jobs and what they produced: the search projection (invariant 11's read
//! model, deletes included) and fenced completion (invariant 4).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::model::{COMPLETED, DELETED, DbEvidence, JOB_DELETED, Kind, SUCCEEDED, SearchDocument};
use crate::report::{CheckReport, Violation};

pub const SEARCH_MATCHES_JOBS: &str = "search_matches_jobs";
pub const DELETED_NOT_SEARCHABLE: &str = "deleted_not_searchable";
pub const JOB_COMPLETION: &str = "job_completion";

/// Jobs an `export.deleted` event was appended for (by subject).
fn deleted_jobs(db: &DbEvidence) -> HashSet<&str> {
    db.outbox.iter().filter(|o| o.event_type == DELETED).map(|o| o.subject.as_str()).collect()
}

/// Documents searches can find: the active generation without tombstones.
fn live_documents(db: &DbEvidence) -> BTreeMap<&str, &SearchDocument> {
    db.search_documents.iter().filter(|d| !d.tombstone).map(|d| (d.job_id.as_str(), d)).collect()
}

/// The active generation's documents are exactly the succeeded, undeleted
/// jobs, each with the job's caller and selected result. A deleted job's
/// document is [`deleted_not_searchable`]'s to name.
pub fn search_matches_jobs(db: &DbEvidence) -> CheckReport {
    let deleted = deleted_jobs(db);
    let expected: BTreeMap<&str, _> =
        db.jobs.iter().filter(|j| j.status == SUCCEEDED && !deleted.contains(j.job_id.as_str())).map(|j| (j.job_id.as_str(), j)).collect();
    let documents = live_documents(db);
    let g = db.active_generation;
    let mut violations = Vec::new();
    for (id, job) in &expected {
        match documents.get(id) {
            None => violations.push(Violation::new("missing_document", format!("job {id} succeeded but generation {g} has no document"))),
            Some(doc) if Some(&doc.result_id) != job.result_id.as_ref() || doc.caller != job.caller => violations.push(Violation::new(
                "stale_document",
                format!(
                    "job {id}: document says result {} of {}, the job {:?} of {}",
                    doc.result_id, doc.caller, job.result_id, job.caller
                ),
            )),
            Some(_) => {}
        }
    }
    let status: HashMap<&str, &str> = db.jobs.iter().map(|j| (j.job_id.as_str(), j.status.as_str())).collect();
    for id in documents.keys().filter(|id| !expected.contains_key(*id) && !deleted.contains(*id)) {
        match status.get(id) {
            Some(&JOB_DELETED) => {}
            Some(s) => {
                violations.push(Violation::new("extra_document", format!("generation {g} has a document for job {id}, which is {s}")))
            }
            None => violations
                .push(Violation::new("extra_document", format!("generation {g} has a document for job {id}, which does not exist"))),
        }
    }
    CheckReport::new(
        SEARCH_MATCHES_JOBS,
        "11: active search generation = succeeded, undeleted jobs",
        expected.len() + documents.len(),
        violations,
    )
}

/// No deleted job — status `deleted`, or an `export.deleted` event — has a
/// document searches can find in the active generation (its tombstone does
/// not count). Every live document is looked up.
pub fn deleted_not_searchable(db: &DbEvidence) -> CheckReport {
    let mut deleted = deleted_jobs(db);
    deleted.extend(db.jobs.iter().filter(|j| j.status == JOB_DELETED).map(|j| j.job_id.as_str()));
    let documents = live_documents(db);
    let g = db.active_generation;
    let violations = documents
        .keys()
        .filter(|id| deleted.contains(*id))
        .map(|id| Violation::new("deleted_job_searchable", format!("job {id} was deleted, yet generation {g} still finds its document")))
        .collect();
    CheckReport::new(
        DELETED_NOT_SEARCHABLE,
        "11: deleted jobs absent from the active search generation",
        documents.len() + deleted.len(),
        violations,
    )
}

/// Each succeeded job has exactly one completion event and one selected,
/// registered artifact that exists in the store (not asked of a deleted
/// job, whose file may be gone); no other job has a completion event (a
/// deleted job keeps the one it had).
pub fn job_completion(db: &DbEvidence, stored: Option<&BTreeSet<String>>) -> CheckReport {
    let mut completions: HashMap<&str, usize> = HashMap::new();
    for o in db.outbox.iter().filter(|o| o.event_type == COMPLETED) {
        *completions.entry(o.subject.as_str()).or_default() += 1;
    }
    let registered: HashSet<(&str, &str)> = db.artifacts.iter().map(|a| (a.result_id.as_str(), a.job_id.as_str())).collect();
    let deleted = deleted_jobs(db);
    let mut violations = Vec::new();
    let (mut checked, mut below) = (0, 0);
    for job in &db.jobs {
        let id = job.job_id.as_str();
        let n = completions.get(id).copied().unwrap_or(0);
        if job.status != SUCCEEDED {
            if n > 0 && !deleted.contains(id) {
                violations.push(Violation::new(
                    "completion_without_success",
                    format!("job {id} is {} but has {n} completion event(s)", job.status),
                ));
            }
            continue;
        }
        // Its completion row was dated after the job completed: above the
        // horizon it cannot have been pruned.
        if n == 0 && db.horizons.may_be_pruned(Kind::Outbox, job.completed_at_ms) {
            below += 1;
            continue;
        }
        checked += 1;
        if n != 1 {
            let kind = if n == 0 { "missing_completion" } else { "duplicate_completion" };
            violations.push(Violation::new(kind, format!("job {id} succeeded with {n} completion events")));
        }
        if deleted.contains(id) {
            // Deleting an export may remove its file; its completion stays.
            continue;
        }
        let Some(result) = &job.result_id else {
            violations.push(Violation::new("no_selected_artifact", format!("job {id} succeeded without a selected result")));
            continue;
        };
        if !registered.contains(&(result.as_str(), id)) {
            violations
                .push(Violation::new("unregistered_artifact", format!("job {id} selected {result}, which no attempt of it registered")));
        }
        if stored.is_some_and(|s| !s.contains(result)) {
            violations
                .push(Violation::new("artifact_missing", format!("job {id} selected {result}, which the artifact store does not hold")));
        }
    }
    let known: HashSet<&str> = db.jobs.iter().map(|j| j.job_id.as_str()).collect();
    for (id, n) in completions.iter().filter(|(id, _)| !known.contains(**id)) {
        violations.push(Violation::new("completion_without_job", format!("{n} completion event(s) for unknown job {id}")));
    }
    let mut notes: Vec<String> = super::below_note(below, Kind::Outbox).into_iter().collect();
    if stored.is_none() {
        notes.push("no artifact location given: selected results were not looked up in the store".to_owned());
    }
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    CheckReport::new(JOB_COMPLETION, "4: succeeded job = one completion event + one selected, existing artifact", checked, violations)
        .with_note(note)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ArtifactRow, Job, OutboxRow};

    fn job(id: &str, status: &str) -> Job {
        let result_id = (status == SUCCEEDED).then(|| format!("r-{id}"));
        Job {
            job_id: id.into(),
            caller: "alice".into(),
            status: status.into(),
            result_id,
            format: "csv".into(),
            query: "q".into(),
            created_at_ms: 0,
            completed_at_ms: Some(0),
        }
    }

    fn event(id: &str, event_type: &str, job: &str) -> OutboxRow {
        OutboxRow {
            seq: 0,
            commit_rank: 0,
            source: "/s".into(),
            event_id: id.into(),
            event_type: event_type.into(),
            subject: job.into(),
            topic: "events".into(),
            partition_key: job.into(),
            status: "delivered".into(),
            event_time_ms: 0,
        }
    }

    fn doc(id: &str) -> SearchDocument {
        SearchDocument { job_id: id.into(), caller: "alice".into(), result_id: format!("r-{id}"), tombstone: false }
    }

    fn tombstone(id: &str) -> SearchDocument {
        SearchDocument { tombstone: true, result_id: String::new(), ..doc(id) }
    }

    fn evidence() -> DbEvidence {
        DbEvidence {
            jobs: vec![job("a", SUCCEEDED), job("b", SUCCEEDED), job("c", "failed"), job("d", SUCCEEDED)],
            outbox: vec![event("e1", COMPLETED, "a"), event("e2", COMPLETED, "b"), event("e3", COMPLETED, "d"), event("e4", DELETED, "d")],
            search_documents: vec![doc("a"), doc("b")],
            artifacts: ["a", "b", "d"].iter().map(|j| ArtifactRow { result_id: format!("r-{j}"), job_id: (*j).into() }).collect(),
            active_generation: 1,
            ..DbEvidence::default()
        }
    }

    #[test]
    fn documents_are_the_succeeded_undeleted_jobs() {
        let mut db = evidence();
        db.search_documents.push(tombstone("d"));
        assert!(search_matches_jobs(&db).violations.is_empty());
        db.search_documents.remove(0);
        db.search_documents.push(doc("c"));
        db.search_documents.push(doc("x"));
        // A deleted job's document is deleted_not_searchable's, not named twice.
        db.search_documents.push(doc("d"));
        let report = search_matches_jobs(&db);
        assert_eq!(report.count("missing_document"), 1);
        assert_eq!(report.count("extra_document"), 2, "{:?}", report.violations);
        assert!(report.violations.iter().any(|v| v.detail.contains("job c, which is failed")), "{:?}", report.violations);
        assert!(report.violations.iter().any(|v| v.detail.contains("job x, which does not exist")), "{:?}", report.violations);
    }

    #[test]
    fn deleted_jobs_leave_at_most_a_tombstone() {
        let mut db = evidence();
        db.jobs.push(job("e", JOB_DELETED));
        db.search_documents.extend([tombstone("d"), tombstone("e")]);
        let clean = deleted_not_searchable(&db);
        assert!(clean.violations.is_empty(), "{:?}", clean.violations);
        assert_eq!(clean.checked, 4, "two live documents looked up, two deleted jobs");

        // Deleted by event (d) or by status alone (e): both must be gone.
        db.search_documents.retain(|d| !d.tombstone);
        db.search_documents.extend([doc("d"), doc("e")]);
        let report = deleted_not_searchable(&db);
        assert_eq!(report.count("deleted_job_searchable"), 2, "{:?}", report.violations);
        assert!(report.violations[0].detail.starts_with("job d was deleted"), "{:?}", report.violations);
    }

    #[test]
    fn succeeded_jobs_have_one_completion_and_an_existing_artifact() {
        let mut db = evidence();
        let stored: BTreeSet<String> = ["r-a", "r-b"].map(String::from).into();
        assert!(job_completion(&db, Some(&stored)).violations.is_empty());
        db.outbox.push(event("e5", COMPLETED, "a"));
        db.outbox.retain(|o| o.event_id != "e2");
        db.outbox.push(event("e6", COMPLETED, "c"));
        let report = job_completion(&db, Some(&BTreeSet::from(["r-a".to_owned(), "r-d".to_owned()])));
        assert_eq!(report.count("duplicate_completion"), 1);
        assert_eq!(report.count("missing_completion"), 1);
        assert_eq!(report.count("completion_without_success"), 1);
        assert_eq!(report.count("artifact_missing"), 1);
        assert!(job_completion(&db, None).note.is_some());
    }
}
