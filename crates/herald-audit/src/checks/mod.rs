//! One pure function per invariant: evidence in, a [`CheckReport`] out. No
//! IO here, so every check is tested on evidence built by hand.

mod delivery;
mod inbox;
mod intake;
mod jobs;
mod letters;
mod notify;
mod stats;

pub use delivery::{key_order, outbox_in_kafka};
pub use inbox::inbox_once;
pub use intake::intake_once;
pub use jobs::{deleted_not_searchable, job_completion, search_matches_jobs};
pub use letters::dead_letters_settled;
pub use notify::{duplicates, intents_once, notify_effects};
pub use stats::stats_match_completions;

use herald_envelope::legacy::SOURCE_ALIASES;

use crate::model::{Evidence, Kind};
use crate::report::CheckReport;

/// Every check, in the order the report lists them: from intake along the
/// pipeline to the notification provider.
pub fn all(evidence: &Evidence) -> Vec<CheckReport> {
    let db = &evidence.db;
    let h = &db.horizons;
    vec![
        intake_once(&db.intake_keys, &db.jobs, &db.outbox, h),
        outbox_in_kafka(&db.outbox, &evidence.kafka, h),
        key_order(&db.outbox, &evidence.kafka),
        inbox_once(&db.outbox, &db.inbox, h),
        dead_letters_settled(&db.dead_letters, &db.inbox, h),
        search_matches_jobs(db),
        deleted_not_searchable(db),
        stats_match_completions(&db.completions, &db.undecodable_completions, &db.inbox, &db.stats_counters, h),
        job_completion(db, evidence.stored_artifacts.as_ref()),
        intents_once(&db.completions, &db.inbox, &db.intents, &db.jobs, h),
        notify_effects(&db.intents, evidence.provider_effects.as_ref(), h),
    ]
}

/// "n fact(s) below the <kind> prune horizon not checked", when any were.
pub(crate) fn below_note(skipped: usize, kind: Kind) -> Option<String> {
    (skipped > 0).then(|| format!("{skipped} fact(s) below the {} prune horizon not checked: their rows may be pruned", kind.as_str()))
}

/// An event's identity as the inboxes key it.
pub(crate) fn identity(source: &str, id: &str) -> (String, String) {
    (source.to_owned(), id.to_owned())
}

/// The source an inbox keys on once legacy aliases are mapped, as the
/// consumers map them before their inbox check. Two rows that differ only in
/// the alias are the same fact claimed twice: its effect was applied twice.
pub(crate) fn canonical(source: &str) -> &str {
    SOURCE_ALIASES.iter().find(|(alias, _)| *alias == source).map_or(source, |(_, canonical)| canonical)
}
