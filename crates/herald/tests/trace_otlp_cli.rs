//! One export followed by its trace (issue 22): `herald serve` on
//! PostgreSQL and the real Kafka cluster, exporting spans over OTLP to a
//! receiver in this test, and a notification provider on loopback that
//! records the headers it is called with. A POST carrying a W3C
//! `traceparent` must come back as one trace: the request, the intake, the
//! outbox append, the relay's publish, the worker's attempt, the search
//! subscription's apply and the provider call — and the completion record
//! on the topic carries the trace in `ce_traceparent`, the provider hears it
//! in `traceparent`. Then `herald rebuild search` replays the same history:
//! its replay span names the generation, and it calls no provider. JSON log
//! lines written inside a span carry its trace and span ids.

use std::collections::{BTreeSet, HashMap};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::post;
use herald_kafka::Topics;
use herald_testkit::unique;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const INCOMING: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const WITHIN: Duration = Duration::from_secs(120);

/// A span as the receiver got it.
#[derive(Debug, Clone)]
struct Seen {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    attributes: HashMap<String, String>,
}

#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Seen>>>,
    /// Bodies that were not OTLP protobuf, and why.
    refused: Arc<Mutex<Vec<String>>>,
}

impl Collector {
    fn spans(&self) -> Vec<Seen> {
        self.spans.lock().expect("collector").clone()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attributes(list: &[KeyValue]) -> HashMap<String, String> {
    list.iter().map(|kv| (kv.key.clone(), text(kv.value.as_ref()))).collect()
}

/// OTLP/HTTP with protobuf bodies, as the SDK's exporter sends it.
async fn receive_traces(State(collector): State<Collector>, body: Bytes) -> (StatusCode, [(header::HeaderName, &'static str); 1], Vec<u8>) {
    let protobuf = [(header::CONTENT_TYPE, "application/x-protobuf")];
    let request = match ExportTraceServiceRequest::decode(body) {
        Ok(request) => request,
        Err(e) => {
            collector.refused.lock().expect("collector").push(e.to_string());
            return (StatusCode::BAD_REQUEST, protobuf, Vec::new());
        }
    };
    let mut seen = collector.spans.lock().expect("collector");
    for resource_spans in request.resource_spans {
        let resource = resource_spans.resource.map(|r| attributes(&r.attributes)).unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                seen.push(Seen {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    attributes: attributes(&span.attributes),
                });
            }
        }
    }
    (StatusCode::OK, protobuf, ExportTraceServiceResponse::default().encode_to_vec())
}

/// A call the provider received: (idempotency key, traceparent).
type Call = (String, Option<String>);

#[derive(Clone, Default)]
struct Provider {
    calls: Arc<Mutex<Vec<Call>>>,
}

async fn notification(State(provider): State<Provider>, headers: HeaderMap) -> axum::Json<Value> {
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let mut calls = provider.calls.lock().expect("provider");
    calls.push((header("idempotency-key").unwrap_or_default(), header("traceparent")));
    axum::Json(json!({ "receipt": format!("r-{}", calls.len()) }))
}

async fn serve_on_loopback(app: Router) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

/// What every herald process of the test shares: its database, cluster,
/// topic and group prefixes, and the OTLP endpoint.
struct Setup {
    database: String,
    brokers: String,
    prefix: String,
    groups: String,
    collector_url: String,
}

impl Setup {
    /// `herald <command> <backends> <rest>`.
    fn herald(&self, service: &str, command: &str, rest: &[&str]) -> Command {
        let mut herald = Command::new(env!("CARGO_BIN_EXE_herald"));
        herald
            .arg(command)
            .args(["--database", &self.database, "--kafka", &self.brokers])
            .args(["--topic-prefix", &self.prefix, "--group-prefix", &self.groups])
            .args(rest)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &self.collector_url)
            .env("OTEL_SERVICE_NAME", service)
            // Spans reach the receiver within a tenth of a second of ending.
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .env_remove("HERALD_CONFIG")
            .kill_on_drop(true);
        herald
    }
}

/// Polls `check` until it answers `Some`, or fails with `what`.
async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> anyhow::Result<T> {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        if let Some(found) = check() {
            return Ok(found);
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn api_address(serve: &mut Child) -> anyhow::Result<String> {
    let mut lines = BufReader::new(serve.stdout.take().expect("stdout")).lines();
    let found = async {
        while let Some(line) = lines.next_line().await? {
            if let Some(url) = line.strip_prefix("herald listening on ") {
                return anyhow::Ok(url.to_owned());
            }
        }
        anyhow::bail!("serve ended before it listened")
    };
    let url = tokio::time::timeout(WITHIN, found).await??;
    // The rest is read and dropped: a closed pipe would fail serve's next line.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(url)
}

/// SIGTERM, as an orchestrator stops a process: it drains and exports the
/// spans it still holds.
async fn stop(mut child: Child) -> anyhow::Result<()> {
    let pid = child.id().expect("running").to_string();
    anyhow::ensure!(std::process::Command::new("kill").args(["-TERM", &pid]).status()?.success(), "kill -TERM {pid}");
    let status = tokio::time::timeout(WITHIN, child.wait()).await??;
    anyhow::ensure!(status.success(), "serve exited with {status}");
    Ok(())
}

/// Every JSON line carries trace and span ids; a role's own lines (outside
/// any unit of work) name the role's run span, a trace of its own that no
/// request joins.
async fn every_line_names_a_trace(lines: &[String], collector: &Collector) -> anyhow::Result<()> {
    let valid = |id: &Value, len: usize| id.as_str().is_some_and(|id| id.len() == len && id.bytes().any(|b| b != b'0'));
    let mut started = None;
    for line in lines {
        let line: Value = serde_json::from_str(line).map_err(|e| anyhow::anyhow!("not a JSON line ({e}): {line}"))?;
        let ids = &line["openTelemetry"];
        anyhow::ensure!(valid(&ids["traceId"], 32) && valid(&ids["spanId"], 16), "a line without trace ids: {line}");
        if line["message"] == "subscription started" && line["subscription"] == "search" {
            started = Some(ids.clone());
        }
    }
    let ids = started.ok_or_else(|| anyhow::anyhow!("no `subscription started` line for search"))?;
    assert_ne!(ids["traceId"], TRACE_ID, "a role's lines are not in a request's trace");
    let run = eventually("the search role's run span", || {
        collector.spans().into_iter().find(|s| s.name == "herald.run" && s.attributes.get("role").is_some_and(|r| r == "search"))
    })
    .await?;
    assert_eq!((ids["traceId"].as_str(), ids["spanId"].as_str()), (Some(run.trace_id.as_str()), Some(run.span_id.as_str())), "{run:?}");
    let joined: Vec<Seen> = collector.spans().into_iter().filter(|s| s.trace_id == TRACE_ID && s.name == "herald.run").collect();
    assert!(joined.is_empty(), "no run span in the request's trace: {joined:?}");
    Ok(())
}

fn partitions(brokers: &str, topic: &str) -> anyhow::Result<i32> {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new().set("bootstrap.servers", brokers).create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    Ok(metadata.topics().first().map_or(0, |t| t.partitions().len() as i32))
}

#[tokio::test(flavor = "multi_thread")]
async fn one_trace_links_the_request_the_publish_the_apply_and_the_provider_call() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    herald_store::Db::connect_and_migrate(&test_db.url).await?;
    let collector = Collector::default();
    let provider = Provider::default();
    let setup = Setup {
        database: test_db.url.clone(),
        brokers: herald_testkit::real_broker()?,
        prefix: unique("trace"),
        groups: unique("herald"),
        collector_url: serve_on_loopback(Router::new().route("/v1/traces", post(receive_traces)).with_state(collector.clone())).await?,
    };
    let provider_url = serve_on_loopback(Router::new().route("/v1/notifications", post(notification)).with_state(provider.clone())).await?;
    let artifacts = tempfile::tempdir()?;
    let mut serve = setup
        .herald("herald-serve", "serve", &["--listen", "127.0.0.1:0", "--tokens", "tok:alice", "--notify-url", &provider_url])
        .args(["--artifacts", &artifacts.path().display().to_string(), "--log-format", "json"])
        .env("HERALD_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut stderr = BufReader::new(serve.stderr.take().expect("stderr")).lines();
    let kept = log.clone();
    let reader = tokio::spawn(async move {
        while let Ok(Some(line)) = stderr.next_line().await {
            kept.lock().expect("log").push(line);
        }
    });
    let api = api_address(&mut serve).await?;

    let created: Value = reqwest::Client::new()
        .post(format!("{api}/v1/exports"))
        .bearer_auth("tok")
        .header("idempotency-key", "trace-1")
        .header("traceparent", INCOMING)
        .json(&json!({"format": "csv", "query": "follow me"}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let job_id = created["job_id"].as_str().expect("job_id").to_owned();

    let in_trace = |name: &str, pick: &dyn Fn(&Seen) -> bool| {
        collector.spans().into_iter().find(|s| s.trace_id == TRACE_ID && s.name == name && pick(s))
    };
    let with_job = |s: &Seen| s.attributes.get("job_id").is_some_and(|j| *j == job_id);
    let search = |s: &Seen| s.attributes.get("subscription").is_some_and(|s| s == "search");
    let any = |_: &Seen| true;
    for (name, pick) in [
        ("http.request", &any as &dyn Fn(&Seen) -> bool),
        ("export.intake", &with_job),
        ("outbox.append", &any),
        ("relay.publish", &any),
        ("export.attempt", &with_job),
        ("subscription.apply", &search),
        ("notify.provider_call", &any),
    ] {
        let found = eventually(&format!("span {name} in trace {TRACE_ID}"), || in_trace(name, pick)).await;
        found.map_err(|e| e.context(format!("spans so far: {:?}; refused: {:?}", collector.spans(), collector.refused.lock())))?;
    }
    let call = in_trace("notify.provider_call", &any).expect("found above");
    let (_, heard) = eventually("the provider call", || provider.calls.lock().expect("provider").first().cloned()).await?;
    assert_eq!(heard, Some(format!("00-{TRACE_ID}-{}-01", call.span_id)), "the provider hears the call's own span");
    // A log line written inside a span names that span's trace and span.
    let attempt = in_trace("export.attempt", &with_job).expect("found above");
    let line = eventually("the attempt's log line", || {
        log.lock().expect("log").iter().find(|l| l.contains("attempt started")).map(|l| serde_json::from_str::<Value>(l))
    })
    .await??;
    assert_eq!(line["openTelemetry"]["traceId"], TRACE_ID, "{line}");
    assert_eq!(line["openTelemetry"]["spanId"], attempt.span_id.as_str(), "{line}");
    let published: Vec<Seen> = collector.spans().into_iter().filter(|s| s.trace_id == TRACE_ID && s.name == "relay.publish").collect();
    assert!(published.len() >= 2, "the command and the completion were published in the trace: {published:?}");

    let events = Topics::with_prefix(&setup.prefix).events;
    let records = herald_testkit::kafka::read_all(&setup.brokers, &events, partitions(&setup.brokers, &events)?)?;
    let completion: Vec<_> = records.iter().filter(|r| r.key == job_id).collect();
    assert!(!completion.is_empty(), "the completion record is on {events}");
    for record in completion {
        let traceparent = record.ce_traceparent.as_deref().unwrap_or_default();
        assert_eq!(traceparent.get(3..35), Some(TRACE_ID), "ce_traceparent of {record:?}");
    }
    stop(serve).await?;
    reader.await?;
    let lines = log.lock().expect("log").clone();
    every_line_names_a_trace(&lines, &collector).await?;

    let calls_before = provider.calls.lock().expect("provider").len();
    let rebuild = setup.herald("herald-rebuild", "rebuild", &["search", "--switch", "manual"]).stdout(Stdio::piped()).output().await?;
    assert!(rebuild.status.success(), "{}", String::from_utf8_lossy(&rebuild.stderr));
    let report = String::from_utf8_lossy(&rebuild.stdout);
    let report: Value =
        report.lines().find(|l| l.starts_with('{')).map(serde_json::from_str).transpose()?.expect("a JSON report on stdout");
    let generation = report["generation"].as_i64().expect("generation").to_string();
    let replay = eventually("the replay span", || {
        collector.spans().into_iter().find(|s| s.service == "herald-rebuild" && s.name == "rebuild.replay")
    })
    .await?;
    assert_eq!(replay.attributes.get("generation"), Some(&generation), "{replay:?}");
    assert_eq!(replay.attributes.get("projection").map(String::as_str), Some("search"), "{replay:?}");
    let names: BTreeSet<String> = collector.spans().into_iter().filter(|s| s.service == "herald-rebuild").map(|s| s.name).collect();
    assert!(!names.contains("notify.provider_call"), "a replay calls no provider: {names:?}");
    assert_eq!(provider.calls.lock().expect("provider").len(), calls_before, "no provider call during the rebuild");
    Ok(())
}
