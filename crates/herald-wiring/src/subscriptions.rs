//! The subscriptions of `export.events`, by name: what `herald serve` runs,
//! what `herald consume <subscription>` runs alone, and what `herald dlq
//! redrive|discard` hands a dead letter (and the records parked behind it)
//! back to.

use clap::ValueEnum;
use herald_consumer::{
    Discarded, Handler, HandlerError, Live, Metrics, MetricsSnapshot, Order, Projection, Record, RedriveOutcome, Subscription,
    SubscriptionOptions,
};
use herald_envelope::Registry;
use herald_kafka::KafkaConfig;
use herald_notify::intents::{self, NotifyHandler};
use herald_notify::start::{self, StartAt, StartError};
use herald_projections::search::{self, Search};
use herald_projections::stats::{self, Stats};
use herald_store::dead_letter::DeadLetter;
use herald_store::{Db, Tx};
use tokio_util::sync::CancellationToken;

/// A subscription on the events topic. Each is its own consumer group
/// (`<prefix>.<name>`), inbox scope and dead-letter scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Name {
    /// Search documents of finished exports.
    Search,
    /// Counters by day, caller and format.
    Stats,
    /// Notification intents, one per completion and recipient.
    Notify,
}

impl Name {
    pub const ALL: [Name; 3] = [Name::Search, Name::Stats, Name::Notify];

    pub fn as_str(self) -> &'static str {
        match self {
            Name::Search => search::SUBSCRIPTION,
            Name::Stats => stats::SUBSCRIPTION,
            Name::Notify => intents::SUBSCRIPTION,
        }
    }

    pub fn parse(name: &str) -> Option<Name> {
        Name::ALL.into_iter().find(|n| n.as_str() == name)
    }

    /// This subscription on `events_topic`, consumer group `<group_prefix>.<name>`.
    pub fn subscription(self, group_prefix: &str, kafka: &KafkaConfig, events_topic: &str) -> Subscription {
        Subscription::new(self.as_str(), group_prefix, kafka, &[events_topic])
    }
}

/// Runs subscription `name` until `shutdown`. The notify subscription
/// refuses to start from history (see [`herald_notify::start`]).
pub async fn run(
    name: Name,
    db: &Db,
    sub: &Subscription,
    options: &SubscriptionOptions,
    metrics: &Metrics,
    shutdown: CancellationToken,
) -> anyhow::Result<MetricsSnapshot> {
    run_from(name, db, sub, options, metrics, None, &NotifyHandler::default(), shutdown).await
}

/// [`run`], with the operator's `--start-at` for a notify group that has no
/// committed offset (ignored by the other subscriptions, which build read
/// models and start from the earliest retained record), and the notify
/// subscription's handler (its rules).
#[allow(clippy::too_many_arguments)]
pub async fn run_from(
    name: Name,
    db: &Db,
    sub: &Subscription,
    options: &SubscriptionOptions,
    metrics: &Metrics,
    start_at: Option<StartAt>,
    notify: &NotifyHandler,
    shutdown: CancellationToken,
) -> anyhow::Result<MetricsSnapshot> {
    match name {
        Name::Notify => prepare_notify(db, sub, start_at).await?,
        // Best effort: without a record a generation counts as needing
        // history from offset 0, the conservative answer.
        Name::Search | Name::Stats => {
            if let Err(e) = herald_rebuild::history::record_group_start(db, sub).await {
                tracing::warn!(error = %e, subscription = %sub.name, "could not record where the group starts; rebuilds will assume offset 0");
            }
        }
    }
    let snapshot = match name {
        Name::Search => herald_consumer::run_subscription(sub, db, &live(Search, sub), options, metrics, shutdown).await?,
        Name::Stats => herald_consumer::run_subscription(sub, db, &live(Stats, sub), options, metrics, shutdown).await?,
        Name::Notify => herald_consumer::run_subscription(sub, db, notify, options, metrics, shutdown).await?,
    };
    Ok(snapshot)
}

/// A projection fed by `sub`'s one topic.
pub fn live<P: Projection>(projection: P, sub: &Subscription) -> Live<P> {
    Live::new(projection, sub.topics.first().map_or("", String::as_str))
}

/// Gives the notify group a start position or refuses
/// ([`herald_notify::start::prepare`]). A refusal stays a [`start::Refused`]
/// inside the `anyhow` error: the commands tell the operator's decision
/// (exit 2) from a failure by downcasting to it.
pub async fn prepare_notify(db: &Db, sub: &Subscription, start_at: Option<StartAt>) -> anyhow::Result<()> {
    match start::prepare(db, sub, start_at).await {
        Err(StartError::Refused(refused)) => Err(refused.into()),
        other => Ok(other?),
    }
}

/// The handler of a subscription named at run time (a dead letter's).
pub enum NamedHandler {
    Search(Live<Search>),
    Stats(Live<Stats>),
    Notify(NotifyHandler),
}

impl NamedHandler {
    /// The handler `letter`'s subscription runs, on the letter's topic.
    pub fn of(letter: &DeadLetter, notify: &NotifyHandler) -> anyhow::Result<NamedHandler> {
        Ok(match Name::parse(&letter.subscription) {
            Some(Name::Search) => NamedHandler::Search(Live::new(Search, &letter.topic)),
            Some(Name::Stats) => NamedHandler::Stats(Live::new(Stats, &letter.topic)),
            Some(Name::Notify) => NamedHandler::Notify(notify.clone()),
            None => anyhow::bail!("dead letter {} belongs to unknown subscription `{}`", letter.id, letter.subscription),
        })
    }
}

impl Handler for NamedHandler {
    fn handles(&self, event_type: &str) -> bool {
        match self {
            NamedHandler::Search(h) => h.handles(event_type),
            NamedHandler::Stats(h) => h.handles(event_type),
            NamedHandler::Notify(h) => h.handles(event_type),
        }
    }

    fn order(&self) -> Order {
        match self {
            NamedHandler::Search(h) => h.order(),
            NamedHandler::Stats(h) => h.order(),
            NamedHandler::Notify(h) => h.order(),
        }
    }

    async fn apply(&self, tx: &mut Tx<'_>, records: &[Record<'_>]) -> Result<(), HandlerError> {
        match self {
            NamedHandler::Search(h) => h.apply(tx, records).await,
            NamedHandler::Stats(h) => h.apply(tx, records).await,
            NamedHandler::Notify(h) => h.apply(tx, records).await,
        }
    }
}

/// Redrives `letter` through its subscription's handler, releasing the
/// records parked behind it.
pub async fn redrive(db: &Db, registry: &Registry, notify: &NotifyHandler, letter: &DeadLetter) -> anyhow::Result<RedriveOutcome> {
    let handler = NamedHandler::of(letter, notify)?;
    Ok(herald_consumer::redrive_releasing(db, &handler, registry, letter).await?)
}

/// Discards `letter`, releasing the records parked behind it through its
/// subscription's handler.
pub async fn discard(db: &Db, registry: &Registry, notify: &NotifyHandler, letter: &DeadLetter) -> anyhow::Result<Discarded> {
    let handler = NamedHandler::of(letter, notify)?;
    Ok(herald_consumer::discard(db, &handler, registry, letter).await?)
}
