//! The search benchmark's documents and its clients.
//!
//! Documents: `n` finished exports of `callers` callers (round robin), each
//! query a sentence of a few fixed words and two words out of a vocabulary
//! of 4,096 six-letter words built from syllables, so trigrams are shared
//! between words as in real text. Searches come in five kinds, the cases a
//! planner treats differently: a rare word (a few hits per caller), a common
//! word (more hits than a page), a text that occurs nowhere, and two-letter
//! texts (too short for trigrams) that occur often or never.

use std::time::{Duration, Instant};

use herald_store::Db;
use herald_store::outbox::placeholders;
use tokio_util::sync::CancellationToken;

const SYLLABLES: [&str; 16] = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "po", "qu", "ji", "fa", "gu", "he", "wy"];
const VOCABULARY: u64 = 4096;
const CADENCES: [&str; 4] = ["daily", "weekly", "monthly", "adhoc"];
const REGIONS: [&str; 5] = ["emea", "apac", "amer", "latam", "anz"];
/// Rows per INSERT: 9,000 parameters, under SQLite's and PostgreSQL's bounds.
const ROWS_PER_INSERT: usize = 1000;

/// The `n`-th vocabulary word, three syllables.
fn word(n: u64) -> String {
    let n = n % VOCABULARY;
    [n % 16, (n / 16) % 16, n / 256].iter().map(|&s| SYLLABLES[s as usize]).collect()
}

/// A spread of `i` over the vocabulary (Knuth's multiplicative hash), so
/// neighbouring documents hold different words.
fn spread(i: u64, salt: u64) -> u64 {
    (i.wrapping_add(salt).wrapping_mul(2_654_435_761) >> 7) % VOCABULARY
}

pub fn caller(c: u64) -> String {
    format!("bench-caller-{c:04}")
}

pub fn token(c: u64) -> String {
    format!("bench-token-{c:04}")
}

fn query_text(i: u64) -> String {
    format!(
        "{} orders in {} where product ~ {} or {} (run {i})",
        CADENCES[(spread(i, 3) % 4) as usize],
        REGIONS[(spread(i, 5) % 5) as usize],
        word(spread(i, 1)),
        word(spread(i, 7))
    )
}

/// Writes `n` documents of `callers` callers into generation `generation`
/// of search, `ROWS_PER_INSERT` at a time, each batch its own transaction.
pub async fn load_documents(db: &Db, generation: i64, n: u64, callers: u64) -> anyhow::Result<()> {
    let base_ms = 1_767_225_600_000i64; // 2026-01-01
    let mut start = 0u64;
    while start < n {
        let end = (start + ROWS_PER_INSERT as u64).min(n);
        let values: Vec<String> = (0..end - start).map(|r| format!("({})", placeholders(1 + r as usize * 9, 9))).collect();
        let sql = format!(
            "INSERT INTO search_documents (generation, job_id, caller, format, query, result_id, size_bytes, completed_at_ms, version) VALUES {}",
            values.join(", ")
        );
        let mut insert = sqlx::query(&sql);
        for i in start..end {
            let job_id = format!("bench-job-{i:08}");
            insert = insert
                .bind(generation)
                .bind(job_id.clone())
                .bind(caller(i % callers))
                .bind(if i % 3 == 0 { "json" } else { "csv" })
                .bind(query_text(i))
                .bind(format!("exports/{job_id}/1"))
                .bind(1000 + (i % 100_000) as i64)
                .bind(base_ms + i as i64)
                .bind(1i64);
        }
        insert.execute(db.pool()).await?;
        start = end;
    }
    Ok(())
}

/// What a search looks for, and what its answer must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Rare,
    Common,
    Missing,
    ShortCommon,
    ShortMissing,
}

impl Kind {
    pub const ALL: [Kind; 5] = [Kind::Rare, Kind::Common, Kind::Missing, Kind::ShortCommon, Kind::ShortMissing];

    pub fn label(self) -> &'static str {
        match self {
            Kind::Rare => "rare word (a few hits)",
            Kind::Common => "common word (a full page)",
            Kind::Missing => "absent text (no hit)",
            Kind::ShortCommon => "2 letters, frequent",
            Kind::ShortMissing => "2 letters, absent",
        }
    }

    /// The text of the `n`-th search of this kind; a rare word is one of
    /// document `document`'s (one of the searching caller's, so it has a hit).
    pub fn text(self, n: u64, document: u64) -> String {
        match self {
            Kind::Rare => word(spread(document, 1)),
            Kind::Common => CADENCES[(n % 4) as usize].to_owned(),
            Kind::Missing => format!("zq{}x", word(n)),
            Kind::ShortCommon => SYLLABLES[(n % 16) as usize].to_owned(),
            Kind::ShortMissing => "xq".to_owned(),
        }
    }
}

/// One client's view of the API: a base URL and the caller's token.
#[derive(Clone)]
pub struct Client {
    pub http: reqwest::Client,
    pub base: String,
    pub token: String,
}

/// How a search request ended.
pub enum Outcome {
    /// 200 with this many hits.
    Answered(usize),
    /// 429: over a limit.
    Limited,
    /// 503: the API's pool was busy past its timeout, so it shed the request.
    Shed,
}

impl Client {
    /// One `GET /v1/search`; `check` also parses the hits and verifies each
    /// contains the text (the quiet run checks, the flood only counts).
    pub async fn search(&self, text: &str, check: bool) -> anyhow::Result<Outcome> {
        let response = self.http.get(format!("{}/v1/search", self.base)).query(&[("q", text)]).bearer_auth(&self.token).send().await?;
        match response.status().as_u16() {
            200 if check => {
                let body: serde_json::Value = response.json().await?;
                let hits = body["hits"].as_array().map(Vec::as_slice).unwrap_or_default();
                for hit in hits {
                    let query = hit["query"].as_str().unwrap_or_default();
                    anyhow::ensure!(query.to_lowercase().contains(&text.to_lowercase()), "hit {query:?} does not contain {text:?}");
                }
                Ok(Outcome::Answered(hits.len()))
            }
            200 => {
                response.bytes().await?;
                Ok(Outcome::Answered(0))
            }
            429 => {
                response.bytes().await?;
                Ok(Outcome::Limited)
            }
            503 => {
                response.bytes().await?;
                Ok(Outcome::Shed)
            }
            status => anyhow::bail!("search answered {status}: {}", response.text().await.unwrap_or_default()),
        }
    }
}

/// What one flooding client saw.
#[derive(Debug, Default)]
pub struct Tally {
    pub answered: u64,
    pub limited: u64,
    pub shed: u64,
    pub latencies: Vec<Duration>,
}

/// Searches back to back, cycling through the kinds, until `stop`; a 429
/// or 503 is counted and the next request sent at once (a flood does not
/// wait).
pub async fn flood(client: Client, seed: u64, stop: CancellationToken) -> anyhow::Result<Tally> {
    let mut tally = Tally::default();
    let mut n = seed;
    while !stop.is_cancelled() {
        let kind = Kind::ALL[(n % Kind::ALL.len() as u64) as usize];
        let started = Instant::now();
        match client.search(&kind.text(n, n), false).await? {
            Outcome::Answered(_) => {
                tally.answered += 1;
                tally.latencies.push(started.elapsed());
            }
            Outcome::Limited => tally.limited += 1,
            Outcome::Shed => tally.shed += 1,
        }
        n += 1;
    }
    Ok(tally)
}

/// The `p`-th percentile (0–100) of `sorted`, in milliseconds.
pub fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_six_letters_and_distinct() {
        let words: std::collections::HashSet<String> = (0..VOCABULARY).map(word).collect();
        assert_eq!(words.len(), VOCABULARY as usize);
        assert!(words.iter().all(|w| w.len() == 6));
    }

    #[test]
    fn absent_texts_occur_in_no_document() {
        for i in 0..20_000 {
            let text = query_text(i);
            for n in 0..50 {
                assert!(!text.contains(&Kind::Missing.text(n, 0)));
            }
            assert!(!text.contains(&Kind::ShortMissing.text(0, 0)), "{text}");
        }
    }

    #[test]
    fn a_rare_word_is_in_its_document() {
        for document in [0, 17, 999_999] {
            assert!(query_text(document).contains(&Kind::Rare.text(3, document)));
        }
    }

    #[test]
    fn percentiles_pick_the_rank() {
        let sorted: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&sorted, 99.0), 99.0);
        assert_eq!(percentile_ms(&sorted, 50.0), 50.0);
        assert_eq!(percentile_ms(&sorted, 100.0), 100.0);
    }
}
