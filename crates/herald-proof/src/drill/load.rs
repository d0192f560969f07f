//! The drill's callers: export requests over HTTP at a steady rate, some
//! repeated with the same key (must return the same job), some reusing a key
//! with other parameters (must be refused with 409). A request that got no
//! answer — the API was killed, maybe after its commit — is repeated with
//! the same key until it is answered, as the README tells callers to.

use std::collections::VecDeque;
use std::time::Duration;

use reqwest::StatusCode;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Every `REPEAT_EVERY`-th export is requested twice with the same key.
const REPEAT_EVERY: u64 = 7;
/// Every `CONFLICT_EVERY`-th key is reused with other parameters.
const CONFLICT_EVERY: u64 = 25;

#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadStats {
    /// HTTP requests sent, retries included.
    pub requests: u64,
    /// Distinct idempotency keys (exports asked for).
    pub exports: u64,
    /// Exports whose request was eventually answered with a job.
    pub answered: u64,
    pub repeats: u64,
    pub repeats_same_job: u64,
    pub conflicts: u64,
    pub conflicts_409: u64,
    /// Requests without an answer (connection refused or reset, timeout).
    pub no_answer: u64,
    /// Answers 429/5xx, retried.
    pub refused: u64,
    /// Exports still unanswered when the load gave up.
    pub unanswered: u64,
    /// Intake promises broken: another job for a repeated key, a conflict
    /// accepted.
    pub violations: Vec<String>,
}

struct Pending {
    key: String,
    body: String,
    i: u64,
}

pub struct Load {
    http: reqwest::Client,
    url: String,
    token: String,
}

enum Answer {
    Job(String),
    Status(StatusCode),
    Nothing,
}

impl Load {
    pub fn new(base: &str, token: &str) -> anyhow::Result<Load> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
        Ok(Load { http, url: format!("{base}/v1/exports"), token: token.to_owned() })
    }

    async fn post(&self, stats: &mut LoadStats, key: &str, body: &str) -> Answer {
        stats.requests += 1;
        let sent = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await;
        let Ok(response) = sent else {
            stats.no_answer += 1;
            return Answer::Nothing;
        };
        let status = response.status();
        let answer: Value = response.json().await.unwrap_or(Value::Null);
        match answer["job_id"].as_str() {
            Some(job) if status.is_success() => Answer::Job(job.to_owned()),
            _ => Answer::Status(status),
        }
    }

    /// Requests exports until `stop`, then keeps repeating the unanswered
    /// ones until all are answered or `finish_by` passes.
    pub async fn run(self, rate: f64, stop: CancellationToken, finish_by: Duration) -> LoadStats {
        let mut stats = LoadStats::default();
        let mut retry: VecDeque<Pending> = VecDeque::new();
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.1)));
        let mut i = 0;
        while !stop.is_cancelled() {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            i += 1;
            stats.exports += 1;
            let body = json!({"format": if i % 2 == 0 { "csv" } else { "json" }, "query": format!("drill export {i}")}).to_string();
            self.submit(&mut stats, &mut retry, Pending { key: format!("drill-{i}"), body, i }).await;
            if let Some(again) = retry.pop_front() {
                self.submit(&mut stats, &mut retry, again).await;
            }
        }
        let deadline = Instant::now() + finish_by;
        while let Some(again) = retry.pop_front() {
            if Instant::now() > deadline {
                retry.push_front(again);
                break;
            }
            self.submit(&mut stats, &mut retry, again).await;
            if !retry.is_empty() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        stats.unanswered = retry.len() as u64;
        stats
    }

    async fn submit(&self, stats: &mut LoadStats, retry: &mut VecDeque<Pending>, p: Pending) {
        let job = match self.post(stats, &p.key, &p.body).await {
            Answer::Job(job) => job,
            Answer::Status(status) if status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS => {
                stats.violations.push(format!("key {}: answered {status} to a valid request", p.key));
                return;
            }
            Answer::Status(_) => {
                stats.refused += 1;
                retry.push_back(p);
                return;
            }
            Answer::Nothing => {
                retry.push_back(p);
                return;
            }
        };
        stats.answered += 1;
        if p.i % REPEAT_EVERY == 0 {
            if let Answer::Job(again) = self.post(stats, &p.key, &p.body).await {
                stats.repeats += 1;
                if again == job {
                    stats.repeats_same_job += 1;
                } else {
                    stats.violations.push(format!("key {}: repeated request got job {again}, first got {job}", p.key));
                }
            }
        }
        if p.i % CONFLICT_EVERY == 0 {
            let other = json!({"format": "csv", "query": format!("something else {}", p.i)}).to_string();
            match self.post(stats, &p.key, &other).await {
                Answer::Nothing => {}
                Answer::Status(StatusCode::CONFLICT) => {
                    stats.conflicts += 1;
                    stats.conflicts_409 += 1;
                }
                Answer::Status(status) if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS => {}
                Answer::Status(status) => {
                    stats.conflicts += 1;
                    stats.violations.push(format!("key {}: other parameters answered {status}, not 409", p.key));
                }
                Answer::Job(other_job) => {
                    stats.conflicts += 1;
                    stats.violations.push(format!("key {}: other parameters were accepted as job {other_job}", p.key));
                }
            }
        }
    }
}
