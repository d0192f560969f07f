//! The one lease primitive: an owner, a token and an expiry on a row, the
//! expiry written and judged by the *database's* clock ([`Db::now_sql`]), and
//! writes fenced by the token.
//!
//! Relay slices, notification claims and export attempts all hold leases
//! this way. Each keeps its own table and describes it with a
//! [`LeaseTable`]; what differs between them is a parameter of the
//! statements built here — which rows a take considers ([`Pick`]), the
//! conditions a row must meet, the columns set alongside — never a copy of
//! the lease logic.
//!
//! - **take**: a row is taken when it meets the user's condition and is free
//!   (a user-defined condition, e.g. no claim at all) or its lease expired
//!   (`expires_at <= now`). The take sets a new token: a minted one, or the
//!   next value of a counter such as a generation. Either way every write of
//!   an earlier holder is refused from then on.
//! - **fenced write**: conditional on the row's key and the holder's token,
//!   and optionally on the lease being unexpired (`expires_at > now`), so a
//!   holder whose lease ran out writes nothing even if nobody took it yet.
//! - **renew**: a fenced write that extends the lease. [`LeaseTable::renew_all`]
//!   and writes marked `unexpired` refuse a lease that ran out: it is never
//!   revived, only taken. A user fenced by a counter alone (export attempts)
//!   may renew a lease nobody took yet: its every write is fenced anyway.
//! - **release**: clears the owner (and a minted token) and frees the row.
//!
//! Statements are written with the caller's placeholders first (`$1` to
//! `$binds`, bound by the caller through [`Statement::query`]) and this
//! module's after them, so a user's fragments read as ordinary SQL.

use sqlx::any::AnyArguments;
use sqlx::query::Query;
use sqlx::{Any, Row};

use crate::{Backend, Db, StoreError};

/// How a take mints the token that fences earlier holders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// A random text per take, suffixed with the row's key so that each row
    /// taken by one statement has a token of its own.
    Minted,
    /// An integer column incremented by every take (a generation).
    Counter,
}

/// A lease token as the holder keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    Text(String),
    Counter(i64),
}

/// A key or token value bound into a statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Int(i64),
    Text(String),
    NullText,
}

impl From<i32> for Value {
    fn from(v: i32) -> Value {
        Value::Int(i64::from(v))
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(v.to_owned())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(v)
    }
}

impl From<&Token> for Value {
    fn from(t: &Token) -> Value {
        match t {
            Token::Text(s) => Value::Text(s.clone()),
            Token::Counter(n) => Value::Int(*n),
        }
    }
}

/// A table whose rows are leased: its name and the lease's columns.
#[derive(Debug, Clone, Copy)]
pub struct LeaseTable {
    pub table: &'static str,
    /// The column identifying a row.
    pub key: &'static str,
    pub owner: &'static str,
    pub token: &'static str,
    /// Epoch milliseconds by the database's clock.
    pub expires_at: &'static str,
    pub token_kind: TokenKind,
    /// What a release writes into `expires_at` (`NULL`, or `0` for a NOT
    /// NULL column): a value every later take sees as free or expired.
    pub released: &'static str,
}

/// The lease one holder has on one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub key: Value,
    pub token: Token,
}

/// Which rows a take considers.
#[derive(Debug, Clone, Copy)]
pub enum Pick<'a> {
    /// The row with this key.
    Key(&'a Value),
    /// Up to `limit` rows in `order_by`. On PostgreSQL they are chosen with
    /// `FOR UPDATE SKIP LOCKED`, so concurrent takers get disjoint rows; the
    /// conditions are checked again outside the subquery, so a row a
    /// concurrent taker changed is re-checked after its commit.
    First { order_by: &'a str, limit: i64 },
}

/// A take: who takes, for how long, which rows, and what else it sets.
#[derive(Debug, Clone, Copy)]
pub struct Take<'a> {
    /// `None`: the row is taken away from its holder without a new one (a
    /// takeover that only fences).
    pub owner: Option<&'a str>,
    pub ttl_ms: i64,
    pub pick: Pick<'a>,
    /// A condition every taken row meets, whatever its lease.
    pub eligible: Option<&'a str>,
    /// Rows taken even if their lease has not expired (they hold none).
    pub free: Option<&'a str>,
    /// More `column = expression` assignments; they read the row as it was.
    pub set: Option<&'a str>,
    pub returning: &'a str,
    /// How many placeholders (`$1`…) the fragments above use.
    pub binds: usize,
}

/// A write fenced by a held lease.
#[derive(Debug, Clone, Copy, Default)]
pub struct Write<'a> {
    /// `column = expression` assignments (may be empty when `extend_ms` is set).
    pub set: &'a str,
    /// Extend the lease to this many milliseconds from the database's now.
    pub extend_ms: Option<i64>,
    /// Refuse the write once the lease expired, even if nobody took the row.
    pub unexpired: bool,
    /// A further condition on the row.
    pub also: Option<&'a str>,
    pub returning: Option<&'a str>,
    /// How many placeholders (`$1`…) the fragments above use.
    pub binds: usize,
}

/// A statement built by this module: its SQL and the values it binds after
/// the caller's.
#[derive(Debug, Clone)]
pub struct Statement {
    sql: String,
    args: Vec<Value>,
}

impl Statement {
    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// The query: `caller` binds `$1`…`$binds`, then this module's values follow.
    pub fn query<'q, F>(&'q self, caller: F) -> Query<'q, Any, AnyArguments<'q>>
    where
        F: FnOnce(Query<'q, Any, AnyArguments<'q>>) -> Query<'q, Any, AnyArguments<'q>>,
    {
        self.args.iter().fold(caller(sqlx::query(&self.sql)), |q, arg| match arg {
            Value::Int(n) => q.bind(*n),
            Value::Text(s) => q.bind(s.as_str()),
            Value::NullText => q.bind(None::<String>),
        })
    }

    /// The query of a statement whose fragments bind nothing of their own.
    pub fn plain(&self) -> Query<'_, Any, AnyArguments<'_>> {
        self.query(|q| q)
    }
}

/// Numbers this module's placeholders after the caller's.
struct Args {
    next: usize,
    values: Vec<Value>,
}

impl Args {
    fn new(binds: usize) -> Args {
        Args { next: binds + 1, values: Vec::new() }
    }

    fn push(&mut self, v: Value) -> String {
        self.values.push(v);
        self.next += 1;
        format!("${}", self.next - 1)
    }
}

impl LeaseTable {
    /// `UPDATE … RETURNING` taking the rows `take` describes.
    pub fn take(&self, db: &Db, take: &Take<'_>) -> Statement {
        let now = db.now_sql();
        let LeaseTable { table, key, owner, token, expires_at, .. } = *self;
        let mut args = Args::new(take.binds);
        let owner_arg = args.push(take.owner.map_or(Value::NullText, Value::from));
        let ttl = args.push(Value::Int(take.ttl_ms));
        let new_token = match self.token_kind {
            TokenKind::Minted => format!("{} || '-' || CAST({key} AS TEXT)", args.push(Value::Text(mint()))),
            TokenKind::Counter => format!("{token} + 1"),
        };
        let free = take.free.map_or(String::new(), |f| format!("({f}) OR "));
        let eligible = take.eligible.map_or(String::new(), |e| format!("({e}) AND "));
        let cond = format!("{eligible}({free}{expires_at} <= {now})");
        let pick = match take.pick {
            Pick::Key(k) => format!("{key} = {}", args.push(k.clone())),
            Pick::First { order_by, limit } => {
                let lock = if db.backend() == Backend::Postgres { "FOR UPDATE SKIP LOCKED" } else { "" };
                let limit = args.push(Value::Int(limit));
                format!("{key} IN (SELECT {key} FROM {table} WHERE {cond} ORDER BY {order_by} LIMIT {limit} {lock})")
            }
        };
        let set = take.set.map_or(String::new(), |s| format!(", {s}"));
        let sql = format!(
            "UPDATE {table} SET {owner} = {owner_arg}, {token} = {new_token}, {expires_at} = {now} + {ttl}{set} \
             WHERE {cond} AND {pick} RETURNING {}",
            take.returning
        );
        Statement { sql, args: args.values }
    }

    /// `UPDATE` conditional on `held` (key and token), per `write`.
    pub fn write(&self, db: &Db, held: &Held, write: &Write<'_>) -> Statement {
        let now = db.now_sql();
        let LeaseTable { table, expires_at, .. } = *self;
        let mut args = Args::new(write.binds);
        let mut sets: Vec<String> = Vec::new();
        if !write.set.is_empty() {
            sets.push(write.set.to_owned());
        }
        if let Some(ms) = write.extend_ms {
            sets.push(format!("{expires_at} = {now} + {}", args.push(Value::Int(ms))));
        }
        let mut cond = vec![fence(self, held, &mut args)];
        if write.unexpired {
            cond.push(format!("{expires_at} > {now}"));
        }
        if let Some(also) = write.also {
            cond.push(format!("({also})"));
        }
        let returning = write.returning.map_or(String::new(), |r| format!(" RETURNING {r}"));
        Statement { sql: format!("UPDATE {table} SET {} WHERE {}{returning}", sets.join(", "), cond.join(" AND ")), args: args.values }
    }

    /// Extends every lease of `held` that is still unexpired, in one
    /// statement returning the keys extended (as text): a key not returned
    /// has lost its lease.
    pub fn renew_all(&self, db: &Db, held: &[Held], ttl_ms: i64) -> Statement {
        let now = db.now_sql();
        let LeaseTable { table, key, expires_at, .. } = *self;
        let mut args = Args::new(0);
        let ttl = args.push(Value::Int(ttl_ms));
        let fences: Vec<String> = held.iter().map(|h| fence(self, h, &mut args)).collect();
        let any = if fences.is_empty() { "1 = 0".to_owned() } else { fences.join(" OR ") };
        let sql = format!(
            "UPDATE {table} SET {expires_at} = {now} + {ttl} WHERE {expires_at} > {now} AND ({any}) \
             RETURNING CAST({key} AS TEXT) AS leased_key"
        );
        Statement { sql, args: args.values }
    }

    /// Frees the row `held` names: no owner, the lease over, a minted token
    /// cleared (a counter stays: it is the row's history). `set` and `also`
    /// as in [`Write`], with `binds` placeholders of the caller's.
    pub fn release(&self, held: &Held, set: Option<&str>, also: Option<&str>, binds: usize) -> Statement {
        let LeaseTable { table, owner, token, expires_at, released, .. } = *self;
        let mut args = Args::new(binds);
        let clear_token = if self.token_kind == TokenKind::Minted { format!(", {token} = NULL") } else { String::new() };
        let set = set.map_or(String::new(), |s| format!(", {s}"));
        let fenced = fence(self, held, &mut args);
        let also = also.map_or(String::new(), |a| format!(" AND ({a})"));
        let sql = format!("UPDATE {table} SET {owner} = NULL{clear_token}, {expires_at} = {released}{set} WHERE {fenced}{also}");
        Statement { sql, args: args.values }
    }
}

fn fence(table: &LeaseTable, held: &Held, args: &mut Args) -> String {
    let key = args.push(held.key.clone());
    let token = args.push(Value::from(&held.token));
    format!("({} = {key} AND {} = {token})", table.key, table.token)
}

/// A fresh random token prefix; two takes by the same owner name (a
/// restarted process reuses its name) must differ.
fn mint() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

/// The database's clock in epoch milliseconds, the clock leases are judged by.
pub async fn db_now(db: &Db) -> Result<i64, StoreError> {
    let row = sqlx::query(&format!("SELECT {} AS now_ms", db.now_sql())).fetch_one(db.pool()).await?;
    Ok(row.try_get("now_ms")?)
}
