//! The `herald` binary's wiring: where it runs ([`config`]), how it reaches
//! the database and the cluster ([`connection`]), its roles
//! started together ([`pipeline`]), how long dedup rows must stay
//! ([`retention`]), the subscriptions of `export.events` by
//! name ([`subscriptions`]), topic layout flags ([`topic_args`]) and stop
//! signals ([`signals`]).
//!
//! A crate of its own only because the binary and herald-proof both start
//! this pipeline and Cargo allows no package cycle between them. It is the
//! binary's half, not a domain library: like the binary it reports errors
//! as `anyhow` (every caller prints them and exits), while the domain
//! crates it wires keep their typed errors.

pub mod config;
pub mod connection;
pub mod pipeline;
pub mod prune;
pub mod retention;
pub mod signals;
pub mod subscriptions;
pub mod topic_args;
