//! The `herald` binary's library half: wiring of roles, configuration and
//! the demo, exposed so end-to-end tests start exactly what users run.

pub mod bench;
pub mod cmd_audit;
pub mod cmd_consume;
pub mod cmd_dlq;
pub mod cmd_inbox;
pub mod cmd_notify;
pub mod cmd_outbox;
pub mod cmd_provider_sim;
pub mod cmd_rebuild;
pub mod cmd_relay;
pub mod cmd_schemas;
pub mod cmd_snapshot;
pub mod cmd_status;
pub mod config;
pub mod demo;
pub mod drill;
pub mod lifecycle_args;
pub mod notify_args;
pub mod notify_start;
pub mod pipeline;
pub mod signals;
pub mod subscriptions;
pub mod topic_args;
