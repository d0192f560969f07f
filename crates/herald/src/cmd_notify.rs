//! `herald notify reconcile`: what needs a person, asking a provider that can
//! answer, and recording an operator's decision. `herald notify redrive`:
//! requeuing `failed` and `conflict` intents once their cause is fixed.

use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use herald_notify::reconcile::{self, Decision, Redrive};
use herald_store::Db;
use serde_json::json;

use crate::notify_args::NotifyArgs;

#[derive(Debug, Clone, Args)]
pub struct NotifyCmdArgs {
    #[command(flatten)]
    pub database: crate::connection::DatabaseArgs,
    #[command(subcommand)]
    pub command: NotifyCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum NotifyCommand {
    /// Ask a queryable keyed provider about `unknown` intents, then list what
    /// still needs a person; --mark-sent / --resend record a decision.
    Reconcile {
        #[command(flatten)]
        notify: NotifyArgs,
        /// Record that this intent was delivered (the operator has evidence).
        #[arg(long, conflicts_with = "resend")]
        mark_sent: Option<String>,
        /// Send this intent again, accepting the duplicate risk listed for it.
        #[arg(long)]
        resend: Option<String>,
        /// Who decides, for the audit trail.
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
        #[arg(long)]
        json: bool,
    },
    /// Requeue `failed` and `conflict` intents (one by key, or all in a
    /// status) after their cause was fixed; recorded as the operator's act.
    Redrive {
        /// The intent's idempotency key.
        #[arg(long, conflicts_with = "status", required_unless_present = "status")]
        key: Option<String>,
        /// Every intent in this status.
        #[arg(long, value_enum)]
        status: Option<RedriveStatus>,
        /// Who decides, for the audit trail.
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RedriveStatus {
    Failed,
    Conflict,
}

pub async fn run(args: NotifyCmdArgs) -> anyhow::Result<ExitCode> {
    let db = args.database.open("herald notify", herald_wiring::connection::Schema::Check).await?;
    match args.command {
        NotifyCommand::Reconcile { notify, mark_sent, resend, operator, json } => {
            let decision = mark_sent.map(|k| (k, Decision::MarkSent)).or(resend.map(|k| (k, Decision::Resend)));
            match decision {
                Some((key, decision)) => decide(&db, &key, decision, &operator).await,
                None => reconcile(&db, &notify, json).await,
            }
        }
        NotifyCommand::Redrive { key, status, operator, json } => {
            let what = match (key, status) {
                (Some(key), _) => Redrive::Key(key),
                (None, Some(RedriveStatus::Failed)) => Redrive::Failed,
                (None, Some(RedriveStatus::Conflict)) => Redrive::Conflict,
                (None, None) => {
                    eprintln!("error: --key or --status is required");
                    return Ok(ExitCode::from(2));
                }
            };
            redrive(&db, &what, &operator, json).await
        }
    }
}

async fn decide(db: &Db, key: &str, decision: Decision, operator: &str) -> anyhow::Result<ExitCode> {
    if !reconcile::decide(db, key, decision.clone(), operator).await? {
        eprintln!("error: no unknown or dead intent with key {key}");
        return Ok(ExitCode::from(2));
    }
    println!("{key}: {decision:?} recorded by {operator}");
    Ok(ExitCode::SUCCESS)
}

async fn reconcile(db: &Db, notify: &NotifyArgs, json: bool) -> anyhow::Result<ExitCode> {
    let caps = notify.capabilities();
    let settled = match &notify.notify_url {
        Some(url) if caps.queryable => Some(reconcile::ask_provider(db, &notify.client(url)?, &caps).await?),
        _ => None,
    };
    let open = reconcile::open(db, &caps).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&json!({"asked_provider": settled, "open": open}))?);
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(s) = &settled {
        println!(
            "provider confirmed {} sent, {} requeued, {} not found past key retention (left unknown), {} still open",
            s.confirmed_sent, s.requeued, s.past_retention, s.still_open
        );
    }
    for intent in &open {
        let risk = if intent.resend_may_duplicate { "RESEND MAY DUPLICATE" } else { "" };
        println!(
            "{:<40} {:<8} {:>3} attempts  {}  {}",
            intent.idempotency_key,
            intent.status,
            intent.attempts,
            risk,
            intent.last_error.as_deref().unwrap_or("")
        );
    }
    println!("{} intent(s) need a decision", open.len());
    Ok(ExitCode::SUCCESS)
}

async fn redrive(db: &Db, what: &Redrive, operator: &str, json: bool) -> anyhow::Result<ExitCode> {
    let keys = reconcile::redrive(db, what, operator).await?;
    if let (Redrive::Key(key), true) = (what, keys.is_empty()) {
        eprintln!("error: no failed or conflict intent with key {key}");
        return Ok(ExitCode::from(2));
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&json!({"requeued": keys, "operator": operator}))?);
    } else {
        for key in &keys {
            println!("{key}: requeued by {operator}");
        }
        println!("{} intent(s) requeued", keys.len());
    }
    Ok(ExitCode::SUCCESS)
}
