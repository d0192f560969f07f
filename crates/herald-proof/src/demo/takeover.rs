//! The demo's worker crash: two workers share the command topic; the first
//! attempt to write its candidate hangs there, the demo drops that whole
//! worker as a crash would, and the survivor's recovery scanner takes the
//! job over once its lease expires.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use herald_export::jobs;
use herald_fault::{Action, Hook, Point};
use herald_store::Db;
use tokio::sync::mpsc;

use super::report::Check;

/// Which worker hung on which job.
pub struct Hung {
    pub worker: usize,
    pub job_id: String,
}

/// Hooks for `workers` workers: exactly one attempt in total hangs.
pub fn hang_first_attempt(workers: usize) -> (Vec<Hook>, mpsc::UnboundedReceiver<Hung>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let taken = Arc::new(AtomicBool::new(false));
    let hooks = (0..workers)
        .map(|worker| {
            let (tx, taken) = (tx.clone(), taken.clone());
            Hook::new(move |site| {
                let (tx, taken) = (tx.clone(), taken.clone());
                async move {
                    if site.point == Point::ArtifactWritten && !taken.swap(true, Ordering::SeqCst) {
                        let _ = tx.send(Hung { worker, job_id: site.subject });
                        return std::future::pending().await;
                    }
                    Action::Continue
                }
            })
        })
        .collect();
    (hooks, rx)
}

/// The victim job finished once, by a later generation, with one completion
/// event, and the crashed attempt's candidate was not selected.
pub async fn check(db: &Db, hung: &Hung, within: Duration) -> anyhow::Result<Check> {
    let deadline = tokio::time::Instant::now() + within;
    let job = loop {
        let job = jobs::get_any(db, &hung.job_id).await?.ok_or_else(|| anyhow::anyhow!("victim job vanished"))?;
        if job.status == jobs::SUCCEEDED || tokio::time::Instant::now() > deadline {
            break job;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let completions = herald_status::counts::completions_of(db, &hung.job_id).await?;
    let dead_candidate = format!("exports/{}/g1.{}", job.job_id, job.format);
    let ok = job.status == jobs::SUCCEEDED
        && job.generation >= 3
        && completions == 1
        && job.result_id.as_deref() != Some(dead_candidate.as_str());
    let detail = format!(
        "worker {} crashed mid-attempt; job {} {} at generation {}, {} completion event(s)",
        hung.worker, job.job_id, job.status, job.generation, completions
    );
    Ok(Check::new("crashed worker's job taken over once", ok, detail))
}
