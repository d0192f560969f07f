//! The `herald` binary's commands, exposed so end-to-end tests start exactly
//! what users run. The wiring they share with herald-proof lives in
//! herald-wiring and is re-exported here under its old paths; the demo,
//! drill, benchmarks and provider simulator are herald-proof's.

pub use herald_proof::bench;
pub use herald_wiring::{config, connection, pipeline, signals, subscriptions, topic_args};

pub mod cmd_audit;
pub mod cmd_config;
pub mod cmd_consume;
pub mod cmd_dlq;
pub mod cmd_inbox;
pub mod cmd_migrate;
pub mod cmd_notify;
pub mod cmd_outbox;
pub mod cmd_provider_sim;
pub mod cmd_prune;
pub mod cmd_rebuild;
pub mod cmd_relay;
pub mod cmd_schemas;
pub mod cmd_snapshot;
pub mod cmd_status;
pub mod config_file;
pub mod lifecycle_args;
pub mod notify_args;
