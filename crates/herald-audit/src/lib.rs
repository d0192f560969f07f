//! `herald audit`: the invariants checked against what the system holds —
//! the database, the Kafka history, the artifact store and the notification
//! provider — naming every violation.
//!
//! - [`model`]: the evidence, as plain data (what each adapter reads).
//! - [`checks`]: one pure function per invariant, evidence in, violations out;
//!   no IO, so each is tested on hand-made evidence.
//! - [`report`]: what a check found, printed as a table or JSON.
//! - [`db`], [`kafka`], [`provider`], [`artifacts`]: the adapters that gather
//!   evidence (sqlx, rdkafka, reqwest, object_store).
//! - [`audit`]: gather everything, run every check.
//!
//! The audit reads; it never writes. It is meant for a settled system (after
//! a drain): a record still on its way shows up as "missing".

pub mod artifacts;
pub mod checks;
pub mod db;
pub mod kafka;
pub mod model;
pub mod provider;
pub mod report;

mod error;
mod run;

pub use error::AuditError;
pub use report::{CheckReport, Report, Violation};
pub use run::{DEFAULT_CLOCK_SKEW, Sources, audit, gather};
