//! Jobs and what they produced: the search projection (invariant 11's read
//! model) and fenced completion (invariant 4).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::model::{COMPLETED, DELETED, DbEvidence, SUCCEEDED};
use crate::report::{CheckReport, Violation};

pub const SEARCH_MATCHES_JOBS: &str = "search_matches_jobs";
pub const JOB_COMPLETION: &str = "job_completion";

/// Jobs an `export.deleted` event was appended for (by subject).
fn deleted_jobs(db: &DbEvidence) -> HashSet<&str> {
    db.outbox.iter().filter(|o| o.event_type == DELETED).map(|o| o.subject.as_str()).collect()
}

/// The active generation's documents are exactly the succeeded, undeleted
/// jobs, each with the job's caller and selected result.
pub fn search_matches_jobs(db: &DbEvidence) -> CheckReport {
    let deleted = deleted_jobs(db);
    let expected: BTreeMap<&str, _> =
        db.jobs.iter().filter(|j| j.status == SUCCEEDED && !deleted.contains(j.job_id.as_str())).map(|j| (j.job_id.as_str(), j)).collect();
    let documents: BTreeMap<&str, _> = db.search_documents.iter().map(|d| (d.job_id.as_str(), d)).collect();
    let g = db.active_generation;
    let mut violations = Vec::new();
    for (id, job) in &expected {
        match documents.get(id) {
            None => violations.push(Violation::new("missing_document", format!("job {id} succeeded but generation {g} has no document"))),
            Some(doc) if Some(&doc.result_id) != job.result_id.as_ref() || doc.caller != job.caller => violations.push(Violation::new(
                "stale_document",
                format!("job {id}: document says result {} of {}, the job {:?} of {}", doc.result_id, doc.caller, job.result_id, job.caller),
            )),
            Some(_) => {}
        }
    }
    for id in documents.keys().filter(|id| !expected.contains_key(*id)) {
        let why = if deleted.contains(id) { "was deleted" } else { "has not succeeded" };
        violations.push(Violation::new("extra_document", format!("generation {g} has a document for job {id}, which {why}")));
    }
    CheckReport::new(SEARCH_MATCHES_JOBS, "11: active search generation = succeeded, undeleted jobs", expected.len() + documents.len(), violations)
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
    let mut checked = 0;
    for job in &db.jobs {
        let id = job.job_id.as_str();
        let n = completions.get(id).copied().unwrap_or(0);
        if job.status != SUCCEEDED {
            if n > 0 && !deleted.contains(id) {
                violations.push(Violation::new("completion_without_success", format!("job {id} is {} but has {n} completion event(s)", job.status)));
            }
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
            violations.push(Violation::new("unregistered_artifact", format!("job {id} selected {result}, which no attempt of it registered")));
        }
        if stored.is_some_and(|s| !s.contains(result)) {
            violations.push(Violation::new("artifact_missing", format!("job {id} selected {result}, which the artifact store does not hold")));
        }
    }
    let known: HashSet<&str> = db.jobs.iter().map(|j| j.job_id.as_str()).collect();
    for (id, n) in completions.iter().filter(|(id, _)| !known.contains(**id)) {
        violations.push(Violation::new("completion_without_job", format!("{n} completion event(s) for unknown job {id}")));
    }
    let note = stored.is_none().then(|| "no artifact location given: selected results were not looked up in the store".to_owned());
    CheckReport::new(JOB_COMPLETION, "4: succeeded job = one completion event + one selected, existing artifact", checked, violations).with_note(note)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ArtifactRow, Job, OutboxRow, SearchDocument};

    fn job(id: &str, status: &str) -> Job {
        Job { job_id: id.into(), caller: "alice".into(), status: status.into(), result_id: (status == SUCCEEDED).then(|| format!("r-{id}")) }
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
        }
    }

    fn doc(id: &str) -> SearchDocument {
        SearchDocument { job_id: id.into(), caller: "alice".into(), result_id: format!("r-{id}") }
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
        assert!(search_matches_jobs(&db).violations.is_empty());
        db.search_documents.remove(0);
        db.search_documents.push(doc("c"));
        db.search_documents.push(doc("d"));
        let report = search_matches_jobs(&db);
        assert_eq!(report.count("missing_document"), 1);
        assert_eq!(report.count("extra_document"), 2);
        assert!(report.violations.iter().any(|v| v.detail.contains("job d, which was deleted")), "{:?}", report.violations);
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
