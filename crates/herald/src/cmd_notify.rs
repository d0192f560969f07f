//! `herald notify reconcile`: what needs a person, asking a provider that can
//! answer, and recording an operator's decision.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use herald_notify::reconcile::{self, Decision};
use herald_store::Db;
use serde_json::json;

use crate::notify_args::NotifyArgs;

#[derive(Debug, Clone, Args)]
pub struct NotifyCmdArgs {
    #[command(subcommand)]
    pub command: NotifyCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum NotifyCommand {
    /// Ask a queryable keyed provider about `unknown` intents, then list what
    /// still needs a person; --mark-sent / --resend record a decision.
    Reconcile {
        #[arg(long, env = "HERALD_DATABASE_URL")]
        database: Option<String>,
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
}

pub async fn run(args: NotifyCmdArgs) -> anyhow::Result<ExitCode> {
    let NotifyCommand::Reconcile { database, notify, mark_sent, resend, operator, json } = args.command;
    let Some(url) = database else {
        eprintln!("error: --database (or HERALD_DATABASE_URL) is required");
        return Ok(ExitCode::from(2));
    };
    let db = Db::connect_and_migrate(&url).await?;
    let caps = notify.capabilities();
    if let Some((key, decision)) = mark_sent.map(|k| (k, Decision::MarkSent)).or(resend.map(|k| (k, Decision::Resend))) {
        if !reconcile::decide(&db, &key, decision.clone(), &operator).await? {
            eprintln!("error: no unknown or dead intent with key {key}");
            return Ok(ExitCode::from(2));
        }
        println!("{key}: {decision:?} recorded by {operator}");
        return Ok(ExitCode::SUCCESS);
    }
    let settled = match &notify.notify_url {
        Some(url) if caps.queryable => Some(reconcile::ask_provider(&db, &notify.dispatcher(url)?.0, &caps).await?),
        _ => None,
    };
    let open = reconcile::open(&db, &caps).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&json!({"asked_provider": settled, "open": open}))?);
    } else {
        if let Some(s) = &settled {
            println!("provider confirmed {} sent, {} requeued, {} still open", s.confirmed_sent, s.requeued, s.still_open);
        }
        for intent in &open {
            let risk = if intent.resend_may_duplicate { "RESEND MAY DUPLICATE" } else { "" };
            println!("{:<40} {:<8} {:>3} attempts  {}  {}", intent.idempotency_key, intent.status, intent.attempts, risk, intent.last_error.as_deref().unwrap_or(""));
        }
        println!("{} intent(s) need a decision", open.len());
    }
    Ok(ExitCode::SUCCESS)
}
