//! One pure function per invariant: evidence in, a [`CheckReport`] out. No
//! IO here, so every check is tested on evidence built by hand.

mod delivery;
mod inbox;
mod jobs;
mod notify;

pub use delivery::{key_order, outbox_in_kafka};
pub use inbox::inbox_once;
pub use jobs::{job_completion, search_matches_jobs};
pub use notify::{duplicates, notify_effects};

use crate::model::Evidence;
use crate::report::CheckReport;

/// Every check, in the order the report lists them.
pub fn all(evidence: &Evidence) -> Vec<CheckReport> {
    vec![
        outbox_in_kafka(&evidence.db.outbox, &evidence.kafka),
        key_order(&evidence.db.outbox, &evidence.kafka),
        inbox_once(&evidence.db.outbox, &evidence.db.inbox),
        search_matches_jobs(&evidence.db),
        job_completion(&evidence.db, evidence.stored_artifacts.as_ref()),
        notify_effects(&evidence.db.intents, evidence.provider_effects.as_ref()),
    ]
}

/// An event's identity as the inboxes key it.
pub(crate) fn identity(source: &str, id: &str) -> (String, String) {
    (source.to_owned(), id.to_owned())
}
