//! The simulator's durable ledger (SQLite): every request from its arrival,
//! marked once its answer was handed over in time, every effect, and for the
//! keyed mode every key with the body it was first accepted with. A request
//! never marked is ambiguous: the caller may not have heard its answer —
//! also when the simulator died before executing or answering it.

use std::str::FromStr;

use sha2::{Digest, Sha256};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::{Executor, Row};

/// What a request did to the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// A new effect with this receipt.
    Executed { receipt: String },
    /// The key was seen with the same body: the stored result, no new effect.
    Replayed { receipt: String },
    /// The key was seen with another body: nothing executed.
    Conflict,
}

#[derive(Debug, Clone)]
pub struct Ledger {
    pool: SqlitePool,
}

/// How many effects the receiver executed under one key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeyEffects {
    pub key: Option<String>,
    pub effects: i64,
}

/// Requests that carried one key (`GET /requests/{key}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyRequests {
    /// Recorded as they arrived, executed or not.
    pub requests: i64,
    pub ambiguous: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Totals {
    pub effects: i64,
    pub keys: i64,
    pub requests: i64,
    /// Requests whose answer the caller may not have received: see
    /// [`super::Ambiguity`].
    pub ambiguous: i64,
}

impl Ledger {
    pub async fn open(path: &str) -> Result<Ledger, sqlx::Error> {
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{path}"))?.create_if_missing(true);
        // One connection: the ledger's check-then-insert must not interleave.
        let pool = SqlitePoolOptions::new().max_connections(1).connect_with(options).await?;
        pool.execute(
            "CREATE TABLE IF NOT EXISTS requests (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT, at_ms INTEGER NOT NULL,
                 answered INTEGER NOT NULL DEFAULT 0, kind TEXT);
             CREATE TABLE IF NOT EXISTS effects (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT, body_sha256 TEXT NOT NULL,
                 body TEXT NOT NULL, receipt TEXT NOT NULL, at_ms INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS keys (key TEXT PRIMARY KEY, body_sha256 TEXT NOT NULL, receipt TEXT NOT NULL,
                 at_ms INTEGER NOT NULL);",
        )
        .await?;
        Ok(Ledger { pool })
    }

    /// Records a request as it arrives, before anything else can happen to
    /// it: its seq, to mark how it was answered.
    pub async fn record_request(&self, key: Option<&str>, now_ms: i64) -> Result<i64, sqlx::Error> {
        let done = sqlx::query("INSERT INTO requests (key, at_ms) VALUES (?, ?)").bind(key).bind(now_ms).execute(&self.pool).await?;
        Ok(done.last_insert_rowid())
    }

    /// Applies a request. `keyed_since_ms`: keys accepted before it are
    /// forgotten (retention); `None` in unkeyed mode, where every request is a
    /// new effect.
    pub async fn apply(&self, key: Option<&str>, body: &str, keyed_since_ms: Option<i64>, now_ms: i64) -> Result<Applied, sqlx::Error> {
        let hash = sha256_hex(body.as_bytes());
        let mut tx = self.pool.begin().await?;
        if let (Some(key), Some(since)) = (key, keyed_since_ms) {
            let known = sqlx::query("SELECT body_sha256, receipt FROM keys WHERE key = ? AND at_ms >= ?")
                .bind(key)
                .bind(since)
                .fetch_optional(&mut *tx)
                .await?;
            if let Some(row) = known {
                let stored: String = row.try_get("body_sha256")?;
                if stored != hash {
                    return Ok(Applied::Conflict);
                }
                return Ok(Applied::Replayed { receipt: row.try_get("receipt")? });
            }
        }
        let receipt = format!("rcpt_{}", uuid::Uuid::new_v4().simple());
        sqlx::query("INSERT INTO effects (key, body_sha256, body, receipt, at_ms) VALUES (?, ?, ?, ?, ?)")
            .bind(key)
            .bind(&hash)
            .bind(body)
            .bind(&receipt)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
        if let (Some(key), Some(_)) = (key, keyed_since_ms) {
            sqlx::query("INSERT OR REPLACE INTO keys (key, body_sha256, receipt, at_ms) VALUES (?, ?, ?, ?)")
                .bind(key)
                .bind(&hash)
                .bind(&receipt)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Applied::Executed { receipt })
    }

    /// The request's answer was handed over in time: it is not ambiguous.
    pub async fn answered(&self, request: i64) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE requests SET answered = 1 WHERE seq = ?").bind(request).execute(&self.pool).await?;
        Ok(())
    }

    /// Why the request's answer may not have reached the caller.
    pub async fn ambiguous(&self, request: i64, kind: &str) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE requests SET kind = ? WHERE seq = ?").bind(kind).bind(request).execute(&self.pool).await?;
        Ok(())
    }

    pub async fn receipt_of(&self, key: &str, since_ms: i64) -> Result<Option<String>, sqlx::Error> {
        let row = sqlx::query("SELECT receipt FROM keys WHERE key = ? AND at_ms >= ?")
            .bind(key)
            .bind(since_ms)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| r.try_get("receipt")).transpose()
    }

    pub async fn totals(&self) -> Result<Totals, sqlx::Error> {
        let row = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM effects) AS effects, (SELECT COUNT(*) FROM keys) AS keys, \
             (SELECT COUNT(*) FROM requests) AS requests, (SELECT COUNT(*) FROM requests WHERE answered = 0) AS ambiguous",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(Totals {
            effects: row.try_get("effects")?,
            keys: row.try_get("keys")?,
            requests: row.try_get("requests")?,
            ambiguous: row.try_get("ambiguous")?,
        })
    }

    /// Ambiguous requests per kind (see [`super::Ambiguity`]); `unanswered`:
    /// the simulator stopped (or is still busy) before it answered.
    pub async fn ambiguous_by_kind(&self) -> Result<std::collections::BTreeMap<String, i64>, sqlx::Error> {
        let rows = sqlx::query("SELECT COALESCE(kind, 'unanswered') AS kind, COUNT(*) AS n FROM requests WHERE answered = 0 GROUP BY 1")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok((r.try_get("kind")?, r.try_get("n")?))).collect()
    }

    /// Requests that carried `key`, executed or not.
    pub async fn requests_of(&self, key: &str) -> Result<i64, sqlx::Error> {
        sqlx::query("SELECT COUNT(*) AS n FROM requests WHERE key = ?").bind(key).fetch_one(&self.pool).await?.try_get("n")
    }

    /// Requests that carried `key` and how many of them are ambiguous.
    pub async fn key_requests(&self, key: &str) -> Result<KeyRequests, sqlx::Error> {
        let row = sqlx::query("SELECT COUNT(*) AS requests, COALESCE(SUM(answered = 0), 0) AS ambiguous FROM requests WHERE key = ?")
            .bind(key)
            .fetch_one(&self.pool)
            .await?;
        Ok(KeyRequests { requests: row.try_get("requests")?, ambiguous: row.try_get("ambiguous")? })
    }

    /// Effects per key (`None`: requests without a key), for `herald audit`.
    pub async fn effects_by_key(&self) -> Result<Vec<KeyEffects>, sqlx::Error> {
        let rows = sqlx::query("SELECT key, COUNT(*) AS n FROM effects GROUP BY key ORDER BY key").fetch_all(&self.pool).await?;
        rows.iter().map(|r| Ok(KeyEffects { key: r.try_get("key")?, effects: r.try_get("n")? })).collect()
    }

    /// Ambiguous requests under `key`.
    pub async fn ambiguous_calls_of(&self, key: &str) -> Result<i64, sqlx::Error> {
        sqlx::query("SELECT COUNT(*) AS n FROM requests WHERE key = ? AND answered = 0").bind(key).fetch_one(&self.pool).await?.try_get("n")
    }

    /// Requests neither answered nor found ambiguous yet: still being
    /// served, or cut short by the simulator's death.
    pub async fn requests_unsettled(&self) -> Result<i64, sqlx::Error> {
        sqlx::query("SELECT COUNT(*) AS n FROM requests WHERE answered = 0 AND kind IS NULL").fetch_one(&self.pool).await?.try_get("n")
    }

    /// Effects recorded for `key` (any body), for tests and audits.
    pub async fn effects_of(&self, key: &str) -> Result<i64, sqlx::Error> {
        sqlx::query("SELECT COUNT(*) AS n FROM effects WHERE key = ?").bind(key).fetch_one(&self.pool).await?.try_get("n")
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}
