//! What a drill prints: what was asked, what was killed, what the audit
//! found.

use std::collections::BTreeMap;

use herald_audit::Report;
use serde::Serialize;

use super::drain::{Progress, Totals};
use super::load::LoadStats;
use super::provider::{IntentReport, ProviderReport, Target};

#[derive(Debug, Serialize)]
pub struct Outcome {
    pub chaos_secs: f64,
    pub drain_secs: f64,
    /// Whether the drain reached a settled system before its deadline.
    pub settled: bool,
    pub progress: Progress,
    pub totals: Totals,
    pub load: LoadStats,
    pub kills: BTreeMap<&'static str, u64>,
    pub exits: BTreeMap<&'static str, u64>,
    /// Brokers SIGKILLed (one down at a time) and started again.
    pub broker_kills: u64,
    pub broker_restarts: u64,
    pub kafka_records: usize,
    /// Provider effects beyond the first per key.
    pub notification_duplicates: i64,
    pub provider: ProviderReport,
    pub intents: IntentReport,
    /// The provider mode's targets.
    pub targets: Vec<Target>,
    pub database: String,
    pub audit: Report,
    /// What a rolling upgrade (`--upgrade-from`) did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<super::upgrade::UpgradeReport>,
}

impl Outcome {
    /// Violations: the audit's plus intake promises broken under load.
    pub fn violations(&self) -> usize {
        self.audit.violations + self.load.violations.len()
    }

    pub fn passed(&self) -> bool {
        self.settled
            && self.load.unanswered == 0
            && self.violations() == 0
            && self.notification_duplicates == 0
            && self.targets.iter().all(|t| t.met)
            && self.upgrade.as_ref().is_none_or(super::upgrade::UpgradeReport::ok)
    }

    pub fn print(&self, json: bool) -> anyhow::Result<()> {
        if json {
            let mut value = serde_json::to_value(self)?;
            if let Some(map) = value.as_object_mut() {
                map.insert("violations".into(), self.violations().into());
                map.insert("passed".into(), self.passed().into());
                map.insert("kills_total".into(), self.kills.values().sum::<u64>().into());
            }
            println!("{}", serde_json::to_string_pretty(&value)?);
            return Ok(());
        }
        let (l, t) = (&self.load, &self.totals);
        let row = |name: &str, value: String| println!("  {name:<26} {value}");
        println!("herald drill — {:.0}s of chaos, drained in {:.1}s, database {}\n", self.chaos_secs, self.drain_secs, self.database);
        row(
            "requests",
            format!(
                "{} sent for {} exports; {} repeats (same job {}), {} conflicts (409 {}), {} without answer, {} refused (retried)",
                l.requests, l.exports, l.repeats, l.repeats_same_job, l.conflicts, l.conflicts_409, l.no_answer, l.refused
            ),
        );
        row(
            "jobs",
            format!("{} created, {} succeeded, {} failed; {} exports unanswered", t.jobs, t.jobs_succeeded, t.jobs_failed, l.unanswered),
        );
        row(
            "events",
            format!(
                "{} outbox rows ({} completions), {} records in Kafka, {} dead letters",
                t.outbox_rows, t.completion_events, self.kafka_records, t.dead_letters
            ),
        );
        let (p, i) = (&self.provider, &self.intents);
        let kinds: Vec<String> = p.ambiguous_by_kind.iter().map(|(kind, n)| format!("{kind} {n}")).collect();
        row(
            "provider",
            format!(
                "{:?}: {} requests, {} effects, {} duplicates, {} ambiguous calls ({})",
                p.mode,
                p.requests,
                p.effects,
                p.duplicates,
                p.ambiguous_calls,
                kinds.join(", ")
            ),
        );
        let statuses: Vec<String> = i.by_status.iter().map(|(status, n)| format!("{status} {n}")).collect();
        row("intents", format!("{} ({})", i.total, statuses.join(", ")));
        row(
            "unknown",
            format!(
                "{} after an unanswered call, {} after an interrupted call, {} after a call the provider never recorded",
                i.unknown_unanswered, i.unknown_interrupted, i.unknown_unseen
            ),
        );
        for (reason, n) in &i.unknown_reasons {
            println!("    {n:>5}  {reason}");
        }
        let kills: Vec<String> = self.kills.iter().map(|(role, n)| format!("{role} {n}")).collect();
        row("kills by role", format!("{} ({})", self.kills.values().sum::<u64>(), kills.join(", ")));
        let exits: Vec<String> = self.exits.iter().map(|(role, n)| format!("{role} {n}")).collect();
        row("exits on their own", if exits.is_empty() { "0".into() } else { exits.join(", ") });
        row("broker kills", format!("{} SIGKILLed, {} restarted (one down at a time)", self.broker_kills, self.broker_restarts));
        if let Some(u) = &self.upgrade {
            row(
                "upgrade",
                format!("{} -> {} (schema {} -> {}, migrate exit {:?})", u.from, u.to, u.schema_before, u.schema_after, u.migrate_exit),
            );
            let f = &u.in_flight;
            row(
                "in flight at migrate",
                format!(
                    "{} outbox rows, {} completions unconsumed, {} calls under a claim, {} rebuilds building",
                    f.pending_outbox, f.unconsumed, f.calls_under_claim, f.rebuilds_building
                ),
            );
            let steps: Vec<String> = u.steps.iter().map(|s| format!("{}->{} (exit {:?})", s.process, s.to, s.stopped_exit)).collect();
            row("steps", steps.join(", "));
            row(
                "restarted after their step",
                if u.restarted_after_step.is_empty() { "none".into() } else { u.restarted_after_step.join(", ") },
            );
            let r = &u.rebuild;
            row(
                "rebuild handover",
                format!(
                    "generation {} {} when killed; resumed exit {:?}, active {:?}",
                    r.generation, r.interrupted_state, r.resume_exit, r.active_after
                ),
            );
        }
        row("drain", if self.settled { "settled".into() } else { format!("NOT settled: {:?}", self.progress) });
        row("violations", format!("{} ({} audit, {} intake)", self.violations(), self.audit.violations, l.violations.len()));
        row("notification duplicates", self.notification_duplicates.to_string());
        for target in &self.targets {
            row(&format!("target: {}", target.name), format!("{} — {}", if target.met { "met" } else { "MISSED" }, target.detail));
        }
        for v in &l.violations {
            println!("    intake: {v}");
        }
        println!("\naudit:");
        print!("{}", self.audit.table(10));
        println!("\ndrill {}", if self.passed() { "passed" } else { "FAILED" });
        Ok(())
    }
}
