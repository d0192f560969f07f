//! The artifact store's side: which selected results it still holds.

use std::collections::BTreeSet;

use herald_export::artifact::ArtifactStore;

use crate::AuditError;
use crate::model::{DbEvidence, SUCCEEDED};

/// Result ids selected by succeeded jobs that `store` holds.
pub async fn stored_results(store: &ArtifactStore, db: &DbEvidence) -> Result<BTreeSet<String>, AuditError> {
    let mut stored = BTreeSet::new();
    for result in db.jobs.iter().filter(|j| j.status == SUCCEEDED).filter_map(|j| j.result_id.as_ref()) {
        if store.exists(result).await? {
            stored.insert(result.clone());
        }
    }
    Ok(stored)
}
