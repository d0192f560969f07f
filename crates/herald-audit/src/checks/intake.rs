//! Intake (invariant 1): one job per (caller, operation, key), and a request
//! answered 409 — same key, other parameters — wrote nothing.

use std::collections::{HashMap, HashSet};

use herald_export::{ExportRequest, Format};

use crate::model::{Horizons, IntakeKey, Job, Kind, OutboxRow, REQUESTED};
use crate::report::{CheckReport, Violation};

pub const INTAKE_ONCE: &str = "intake_once";

/// Each job was created by exactly one intake key of its caller and holds
/// the parameters that key was accepted with; every command names a job.
///
/// A 409 that wrote would show as a job no key points to (the loser's job),
/// or as a key whose job holds the conflicting parameters.
pub fn intake_once(keys: &[IntakeKey], jobs: &[Job], outbox: &[OutboxRow], horizons: &Horizons) -> CheckReport {
    let mut below = 0;
    let by_id: HashMap<&str, &Job> = jobs.iter().map(|j| (j.job_id.as_str(), j)).collect();
    let mut keys_of: HashMap<&str, Vec<&IntakeKey>> = HashMap::new();
    let mut violations = Vec::new();
    for key in keys {
        keys_of.entry(key.job_id.as_str()).or_default().push(key);
        match by_id.get(key.job_id.as_str()) {
            None => violations
                .push(Violation::new("intent_without_job", format!("{} names job {}, which does not exist", describe(key), key.job_id))),
            Some(job) => violations.extend(key_matches_job(key, job)),
        }
    }
    for job in jobs {
        match keys_of.get(job.job_id.as_str()).map_or(0, Vec::len) {
            1 => {}
            // Its key was accepted with the job: a prune removed it.
            0 if horizons.below(Kind::IntakeKeys, job.created_at_ms) => below += 1,
            0 => violations
                .push(Violation::new("job_without_intent", format!("job {} of {} was created by no intake key", job.job_id, job.caller))),
            n => violations.push(Violation::new("shared_job", format!("job {} is the job of {n} intake keys", job.job_id))),
        }
    }
    let known: HashSet<&str> = by_id.keys().copied().collect();
    for command in outbox.iter().filter(|o| o.event_type == REQUESTED && !known.contains(o.subject.as_str())) {
        violations.push(Violation::new(
            "command_without_job",
            format!("command {} (outbox seq {}) names job {}, which does not exist", command.event_id, command.seq, command.subject),
        ));
    }
    CheckReport::new(
        INTAKE_ONCE,
        "1: one job per intake key, with the parameters it was accepted with",
        keys.len() + jobs.len() - below,
        violations,
    )
    .with_note(super::below_note(below, Kind::IntakeKeys))
}

fn describe(key: &IntakeKey) -> String {
    format!("key {:?} of {} ({})", key.key, key.caller, key.operation)
}

fn key_matches_job(key: &IntakeKey, job: &Job) -> Option<Violation> {
    if key.caller != job.caller {
        return Some(Violation::new("wrong_caller", format!("{} names job {} of {}", describe(key), job.job_id, job.caller)));
    }
    match fingerprint(job) {
        Ok(f) if f == key.fingerprint => None,
        Ok(_) => Some(Violation::new(
            "fingerprint_mismatch",
            format!("job {} holds parameters other than those {} was accepted with", job.job_id, describe(key)),
        )),
        Err(why) => Some(Violation::new("fingerprint_mismatch", format!("job {} of {}: {why}", job.job_id, describe(key)))),
    }
}

/// The fingerprint intake computed for the job's parameters; the same
/// function, since "same parameters" is intake's definition.
fn fingerprint(job: &Job) -> Result<String, String> {
    let format = Format::parse(&job.format).map_err(|e| e.to_string())?;
    Ok(ExportRequest { format, query: job.query.clone() }.fingerprint())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intake_once(keys: &[IntakeKey], jobs: &[Job], outbox: &[OutboxRow]) -> CheckReport {
        super::intake_once(keys, jobs, outbox, &Horizons::default())
    }

    fn job(id: &str, query: &str) -> Job {
        Job {
            job_id: id.into(),
            caller: "alice".into(),
            status: "succeeded".into(),
            result_id: None,
            format: "csv".into(),
            query: query.into(),
            created_at_ms: 0,
            completed_at_ms: None,
        }
    }

    fn key(k: &str, job: &Job) -> IntakeKey {
        let fingerprint = fingerprint(job).expect("valid job");
        IntakeKey { caller: job.caller.clone(), operation: "export.create".into(), key: k.into(), fingerprint, job_id: job.job_id.clone() }
    }

    fn command(job: &str) -> OutboxRow {
        OutboxRow {
            seq: 1,
            commit_rank: 1,
            source: "/s".into(),
            event_id: format!("c-{job}"),
            event_type: REQUESTED.into(),
            subject: job.into(),
            topic: "commands".into(),
            partition_key: job.into(),
            status: "delivered".into(),
            event_time_ms: 0,
        }
    }

    #[test]
    fn each_job_has_one_key_with_its_parameters() {
        let jobs = vec![job("a", "q1"), job("b", "q2")];
        let keys = vec![key("k1", &jobs[0]), key("k2", &jobs[1])];
        let outbox = [command("a"), command("b"), command("a")];
        let clean = intake_once(&keys, &jobs, &outbox);
        assert!(clean.violations.is_empty(), "{:?}", clean.violations);
        assert_eq!(clean.checked, 4);
    }

    #[test]
    fn a_conflicting_request_that_wrote_is_named() {
        let mut jobs = vec![job("a", "q1"), job("b", "q2")];
        let keys = vec![key("k1", &jobs[0]), key("k2", &jobs[1])];
        // The loser of a race, or a 409, left a job behind.
        jobs.push(job("c", "other"));
        // Another request's parameters written over a key's job.
        jobs[1].query = "conflicting".into();
        let report = intake_once(&keys, &jobs, &[command("zz")]);
        assert_eq!(report.count("job_without_intent"), 1, "{:?}", report.violations);
        assert_eq!(report.count("fingerprint_mismatch"), 1, "{:?}", report.violations);
        assert_eq!(report.count("command_without_job"), 1, "{:?}", report.violations);
        assert!(report.violations.iter().any(|v| v.detail.contains("job c of alice")), "{:?}", report.violations);
        assert!(report.violations.iter().any(|v| v.detail.starts_with("job b holds")), "{:?}", report.violations);
    }

    #[test]
    fn keys_pointing_elsewhere_are_named() {
        let mut jobs = vec![job("a", "q1")];
        let mut keys = vec![key("k1", &jobs[0]), key("k2", &jobs[0])];
        keys.push(IntakeKey { job_id: "gone".into(), ..keys[0].clone() });
        jobs[0].format = "xml".into();
        let report = intake_once(&keys, &jobs, &[]);
        assert_eq!(report.count("shared_job"), 1);
        assert_eq!(report.count("intent_without_job"), 1);
        assert_eq!(report.count("fingerprint_mismatch"), 2, "an invalid format never matches: {:?}", report.violations);

        let mut jobs = vec![job("a", "q1")];
        let keys = vec![key("k1", &jobs[0])];
        jobs[0].caller = "mallory".into();
        assert_eq!(intake_once(&keys, &jobs, &[]).count("wrong_caller"), 1);
    }
}
