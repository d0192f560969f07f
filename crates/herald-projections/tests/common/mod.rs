//! What the search tests write: a finished export of alice's.

use herald_envelope::ExportCompleted;
use herald_projections::search::Fact;

/// `job` completed at business `version` (also its completion time), its
/// query `"<job> v<version>"` so a search can tell versions apart.
pub fn completed(job: &str, version: i64) -> Fact {
    Fact::Completed(ExportCompleted {
        job_id: job.into(),
        caller: "alice".into(),
        format: "csv".into(),
        query: format!("{job} v{version}"),
        result_id: "r".into(),
        size_bytes: 1,
        sha256: String::new(),
        completed_at_ms: version,
        version,
        content_type: "text/csv".into(),
    })
}
