//! Order totals per customer: a read model of your own on Herald's
//! projection engine, fed by a shop service that appends its events through
//! the outbox contract (docs/outbox-contract.md) as JSON.
//!
//! Everything here is what a user writes: the events' Rust types, one table,
//! and the [`Projection`] implementation (which events, what each teaches,
//! how a batch is written into a generation, how two generations compare).
//! The engine brings the rest: the live subscription with its inbox dedup,
//! dead letters and metrics ([`herald_consumer::run_subscription`] over
//! [`herald_consumer::Live`]), and rebuilds into a new generation that
//! verify against the live one and switch reads
//! ([`herald_rebuild::rebuild::rebuild`]).

use herald_consumer::{Fingerprint, HandlerError, Projection};
use herald_envelope::DecodedEvent;
use herald_store::{Db, StoreError, Tx};
use serde::Deserialize;
use sqlx::Row;

/// The CloudEvents `source` of the shop service's events.
pub const SOURCE: &str = "/shop/orders";
pub const PLACED: &str = "shop.order.placed";
pub const REFUNDED: &str = "shop.order.refunded";

/// `shop.order.placed`, as the shop service writes it (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
    pub customer: String,
    pub total_cents: i64,
}

/// `shop.order.refunded`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct OrderRefunded {
    pub order_id: String,
    pub customer: String,
    pub refunded_cents: i64,
}

/// What one event changes in a customer's totals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub customer: String,
    pub orders: i64,
    pub net_cents: i64,
}

/// The read model: per generation and customer, orders placed and net cents.
pub struct OrderTotals;

/// Creates the projection's table (idempotent; SQL both databases accept)
/// and registers the projection's first generation.
pub async fn install(db: &Db) -> Result<(), herald_rebuild::RebuildError> {
    let create = "CREATE TABLE IF NOT EXISTS order_totals (generation BIGINT NOT NULL, customer TEXT NOT NULL, \
                  orders BIGINT NOT NULL, net_cents BIGINT NOT NULL, PRIMARY KEY (generation, customer))";
    if let Err(e) = sqlx::query(create).execute(db.pool()).await {
        // Two processes creating it at once: PostgreSQL's IF NOT EXISTS
        // checks before it inserts the type, so the loser sees a unique
        // violation. The table exists then; a second try says so.
        let raced = e.as_database_error().is_some_and(|d| d.is_unique_violation());
        if !raced {
            return Err(StoreError::from(e).into());
        }
        sqlx::query(create).execute(db.pool()).await.map_err(StoreError::from)?;
    }
    herald_rebuild::generations::register(db, OrderTotals::NAME).await?;
    Ok(())
}

/// A customer's totals in the generation reads use.
pub async fn totals_of(db: &Db, customer: &str) -> Result<Option<(i64, i64)>, StoreError> {
    let generation = herald_store::generations::active(db, OrderTotals::NAME).await?;
    let row = sqlx::query("SELECT orders, net_cents FROM order_totals WHERE generation = $1 AND customer = $2")
        .bind(generation)
        .bind(customer)
        .fetch_optional(db.pool())
        .await?;
    row.map(|r| Ok((r.try_get("orders")?, r.try_get("net_cents")?))).transpose()
}

impl Projection for OrderTotals {
    const NAME: &'static str = "order_totals";
    /// Sums are not idempotent: the engine keeps an inbox row per event so a
    /// redelivered or republished event counts once.
    const IDEMPOTENT: bool = false;
    type Fact = Change;

    fn handles(event_type: &str) -> bool {
        event_type == PLACED || event_type == REFUNDED
    }

    /// Data that does not fit the type is a permanent error: the live
    /// subscription dead-letters the record (redrivable after a fix) and a
    /// replay skips it.
    fn fact(event: &DecodedEvent) -> Result<Change, HandlerError> {
        if event.event_type == PLACED {
            let placed: OrderPlaced = event.json_as()?;
            Ok(Change { customer: placed.customer, orders: 1, net_cents: placed.total_cents })
        } else {
            let refunded: OrderRefunded = event.json_as()?;
            Ok(Change { customer: refunded.customer, orders: 0, net_cents: -refunded.refunded_cents })
        }
    }

    async fn write(&self, tx: &mut Tx<'_>, generation: i64, facts: &[&Change]) -> Result<(), HandlerError> {
        // One statement per customer, customers in one order in every
        // transaction: two concurrent batches cannot deadlock on them.
        let mut by_customer: std::collections::BTreeMap<&str, (i64, i64)> = std::collections::BTreeMap::new();
        for fact in facts {
            let sums = by_customer.entry(fact.customer.as_str()).or_default();
            sums.0 += fact.orders;
            sums.1 += fact.net_cents;
        }
        for (customer, (orders, net_cents)) in by_customer {
            sqlx::query(
                "INSERT INTO order_totals (generation, customer, orders, net_cents) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (generation, customer) DO UPDATE SET orders = order_totals.orders + EXCLUDED.orders, \
                 net_cents = order_totals.net_cents + EXCLUDED.net_cents",
            )
            .bind(generation)
            .bind(customer)
            .bind(orders)
            .bind(net_cents)
            .execute(&mut **tx)
            .await
            .map_err(StoreError::from)?;
        }
        Ok(())
    }

    async fn fingerprint(&self, tx: &mut Tx<'_>, generation: i64) -> Result<Fingerprint, StoreError> {
        let rows = sqlx::query("SELECT customer, orders, net_cents FROM order_totals WHERE generation = $1 ORDER BY customer")
            .bind(generation)
            .fetch_all(&mut **tx)
            .await?;
        let listed = rows
            .iter()
            .map(|r| {
                let customer: String = r.try_get("customer")?;
                Ok(format!("{customer}:{}:{}", r.try_get::<i64, _>("orders")?, r.try_get::<i64, _>("net_cents")?))
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok(Fingerprint { rows: rows.len() as i64, other: 0, checksum: listed.join(",") })
    }
}
