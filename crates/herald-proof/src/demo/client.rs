//! The demo's HTTP caller: real requests over loopback, as a user would send.

use std::collections::HashSet;
use std::net::SocketAddr;

use anyhow::Context;
use herald_status::counts;
use herald_store::Db;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::report::Check;

pub struct DemoClient {
    http: reqwest::Client,
    base: String,
    token: String,
}

/// What intake answered.
pub struct Intake {
    pub requested: usize,
    pub repeated: usize,
    /// Job id per export, in request order.
    pub job_ids: Vec<String>,
    pub accepted: usize,
    pub repeats_same_job: usize,
    pub conflict_status: u16,
}

impl Intake {
    pub fn checks(&self) -> Vec<Check> {
        let distinct: HashSet<&String> = self.job_ids.iter().collect();
        vec![
            Check::new(
                "every request accepted with 202",
                self.accepted == self.requested,
                format!("{} of {}", self.accepted, self.requested),
            ),
            Check::new("one job per idempotency key", distinct.len() == self.requested, format!("{} distinct jobs", distinct.len())),
            Check::new(
                "repeated requests returned the same job",
                self.repeats_same_job == self.repeated,
                format!("{} of {}", self.repeats_same_job, self.repeated),
            ),
            Check::new("same key, other parameters → 409", self.conflict_status == 409, format!("status {}", self.conflict_status)),
        ]
    }
}

fn query_text(i: usize) -> String {
    format!("demo export #{i:05}")
}

impl DemoClient {
    pub fn new(addr: SocketAddr, token: String) -> DemoClient {
        DemoClient { http: reqwest::Client::new(), base: format!("http://{addr}"), token }
    }

    async fn post(&self, key: Option<&str>, token: &str, body: &str) -> anyhow::Result<(StatusCode, Value)> {
        let mut request = self
            .http
            .post(format!("{}/v1/exports", self.base))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = request.send().await.context("POST /v1/exports")?;
        let status = response.status();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    pub async fn submit_all(&self, n: usize, repeat_every: usize) -> anyhow::Result<Intake> {
        let mut intake =
            Intake { requested: n, repeated: 0, job_ids: Vec::with_capacity(n), accepted: 0, repeats_same_job: 0, conflict_status: 0 };
        for i in 0..n {
            let key = format!("demo-{i}");
            let body = json!({"format": if i % 2 == 0 { "csv" } else { "json" }, "query": query_text(i)}).to_string();
            let (status, answer) = self.post(Some(&key), &self.token, &body).await?;
            intake.accepted += usize::from(status == StatusCode::ACCEPTED);
            let job_id = answer["job_id"].as_str().unwrap_or_default().to_owned();
            if i % repeat_every == 0 {
                intake.repeated += 1;
                let (_, again) = self.post(Some(&key), &self.token, &body).await?;
                intake.repeats_same_job += usize::from(again["job_id"].as_str() == Some(job_id.as_str()));
            }
            intake.job_ids.push(job_id);
        }
        let conflicting = json!({"format": "json", "query": "something else entirely"}).to_string();
        intake.conflict_status = self.post(Some("demo-1"), &self.token, &conflicting).await?.0.as_u16();
        Ok(intake)
    }

    /// Bad requests get problem+json with the right status and write nothing.
    pub async fn bad_input_checks(&self, db: &Db) -> anyhow::Result<Vec<Check>> {
        let jobs_before = counts::collect(db).await?.jobs.total();
        let good = json!({"format": "csv", "query": "never stored"}).to_string();
        let cases = [
            ("missing Idempotency-Key → 400", None, self.token.as_str(), good.as_str(), 400),
            ("unknown token → 401", Some("bad-1"), "not-a-token", good.as_str(), 401),
            ("malformed body → 422", Some("bad-2"), self.token.as_str(), "{\"format\": \"xml\"", 422),
        ];
        let mut checks = Vec::new();
        for (name, key, token, body, want) in cases {
            let (status, problem) = self.post(key, token, body).await?;
            let is_problem = problem["status"].as_u64() == Some(u64::from(want));
            checks.push(Check::new(name, status.as_u16() == want && is_problem, format!("status {status}")));
        }
        let jobs_after = counts::collect(db).await?.jobs.total();
        checks.push(Check::new(
            "bad input wrote nothing",
            jobs_before == jobs_after,
            format!("{jobs_before} jobs before, {jobs_after} after"),
        ));
        Ok(checks)
    }

    /// The search API finds a finished export by its query text.
    pub async fn search_check(&self, intake: &Intake) -> anyhow::Result<Check> {
        let i = intake.requested / 2;
        let response =
            self.http.get(format!("{}/v1/search", self.base)).bearer_auth(&self.token).query(&[("q", query_text(i))]).send().await?;
        let answer: Value = response.json().await?;
        let hits = answer["hits"].as_array().cloned().unwrap_or_default();
        let found = hits.len() == 1 && hits[0]["job_id"].as_str() == intake.job_ids.get(i).map(String::as_str);
        Ok(Check::new("GET /v1/search finds the export", found, format!("generation {}, {} hit(s)", answer["generation"], hits.len())))
    }
}
