//! `GET /openapi.json` from a real router on loopback: an OpenAPI 3.1
//! document that names every route, the bearer scheme on the caller's
//! routes only, and problem+json for every error; and the errors axum used
//! to answer in plain text answer as documented.

use herald_api::{AppState, Tokens};
use herald_export::IntakeConfig;
use herald_export::artifact::ArtifactStore;
use herald_kafka::Topics;
use herald_store::Db;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "doc-token";

struct Api {
    base: String,
    shutdown: CancellationToken,
    _db: herald_testkit::TestDb,
    _artifacts: tempfile::TempDir,
}

impl Drop for Api {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn api() -> anyhow::Result<Api> {
    let test_db = herald_testkit::sqlite_db()?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let artifacts = tempfile::tempdir()?;
    let state = AppState {
        db,
        intake: IntakeConfig::new(Topics::default()),
        artifacts: ArtifactStore::local(artifacts.path())?,
        tokens: Tokens::single(TOKEN, "alice"),
        searches: herald_api::limits::SearchSlots::default(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let shutdown = CancellationToken::new();
    tokio::spawn(herald_api::serve(listener, state, shutdown.clone()));
    Ok(Api { base, shutdown, _db: test_db, _artifacts: artifacts })
}

async fn document(api: &Api) -> anyhow::Result<Value> {
    let response = reqwest::get(format!("{}/openapi.json", api.base)).await?;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    Ok(response.json().await?)
}

#[tokio::test]
async fn the_document_names_every_route_as_openapi_3() -> anyhow::Result<()> {
    let api = api().await?;
    let doc = document(&api).await?;
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")), "{}", doc["openapi"]);
    // The whole document parses as the OpenAPI model, not just as JSON.
    let parsed: utoipa::openapi::OpenApi = serde_json::from_value(doc.clone())?;
    assert_eq!(parsed.info.title, "Herald");
    let paths = doc["paths"].as_object().expect("paths");
    let mut named: Vec<&str> = paths.keys().map(String::as_str).collect();
    named.sort_unstable();
    assert_eq!(
        named,
        [
            "/healthz",
            "/metrics",
            "/openapi.json",
            "/readyz",
            "/schemas",
            "/schemas/{file}",
            "/status",
            "/status.json",
            "/v1/exports",
            "/v1/exports/{id}",
            "/v1/exports/{id}/result",
            "/v1/search"
        ]
    );
    let methods = |path: &str| -> Vec<String> {
        let mut methods: Vec<String> = paths[path].as_object().expect("item").keys().cloned().collect();
        methods.sort_unstable();
        methods
    };
    assert_eq!(methods("/v1/exports"), ["post"]);
    assert_eq!(methods("/v1/exports/{id}"), ["delete", "get"]);
    let bearer = &doc["components"]["securitySchemes"]["bearer"];
    assert_eq!((bearer["type"].as_str(), bearer["scheme"].as_str()), (Some("http"), Some("bearer")), "{bearer}");

    for (path, item) in paths {
        for (method, operation) in item.as_object().expect("item") {
            let label = format!("{method} {path}");
            let responses = operation["responses"].as_object().expect("responses");
            let secured = operation["security"].as_array().is_some_and(|s| s.iter().any(|r| r.get("bearer").is_some()));
            // The caller's routes need a caller's token; the figures the
            // observer's (on the API's listener); the rest none.
            let needs_token = path.starts_with("/v1/") || path == "/metrics" || path == "/status.json";
            assert_eq!(secured, needs_token, "{label}: a token exactly where one is needed");
            assert_eq!(secured, responses.contains_key("401"), "{label}: a 401 exactly where a token is needed");
            for (status, response) in responses {
                if status.starts_with('4') || status.starts_with('5') {
                    let content = response["content"].as_object().expect("error content");
                    let types: Vec<&String> = content.keys().collect();
                    assert_eq!(types, ["application/problem+json"], "{label} {status}");
                    assert_eq!(content["application/problem+json"]["schema"]["$ref"], "#/components/schemas/Problem");
                }
            }
        }
    }
    let intake = &paths["/v1/exports"]["post"];
    let key = intake["parameters"].as_array().expect("parameters").iter().find(|p| p["name"] == "Idempotency-Key").expect("key");
    assert_eq!((key["in"].as_str(), key["required"].as_bool()), (Some("header"), Some(true)));
    assert_eq!(intake["requestBody"]["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/ExportRequest");
    assert!(intake["responses"]["429"]["headers"]["Retry-After"].is_object());
    Ok(())
}

/// Each answer is problem+json with a status the document lists for the
/// operation: what axum answered in plain text before, and the inputs
/// PostgreSQL would have refused.
#[tokio::test]
async fn rejected_requests_answer_documented_problems() -> anyhow::Result<()> {
    let api = api().await?;
    let doc = document(&api).await?;
    let http = reqwest::Client::new();
    let base = &api.base;
    let big = format!(r#"{{"format":"csv","query":"{}"}}"#, "x".repeat(70_000));
    let cases = [
        ("/v1/exports/{id}", http.get(format!("{base}/v1/exports/%FF")).bearer_auth(TOKEN), 400),
        ("/v1/exports/{id}", http.delete(format!("{base}/v1/exports/%FF%FE")).bearer_auth(TOKEN), 400),
        ("/v1/exports/{id}", http.get(format!("{base}/v1/exports/a%00b")).bearer_auth(TOKEN), 404),
        ("/v1/exports/{id}/result", http.get(format!("{base}/v1/exports/%C0/result")).bearer_auth(TOKEN), 400),
        ("/v1/exports/{id}/result", http.get(format!("{base}/v1/exports/nope/result")).bearer_auth(TOKEN), 404),
        ("/v1/exports", http.post(format!("{base}/v1/exports")).bearer_auth(TOKEN).header("Idempotency-Key", "k").body(big), 413),
        ("/v1/exports", http.post(format!("{base}/v1/exports")).bearer_auth(TOKEN).header("Idempotency-Key", "k").body("{"), 422),
        ("/v1/exports", http.post(format!("{base}/v1/exports")).bearer_auth(TOKEN).header("Idempotency-Key", "  ").body("{}"), 400),
        ("/v1/exports", http.post(format!("{base}/v1/exports")).header("Idempotency-Key", "k").body("{}"), 401),
        ("/v1/search", http.get(format!("{base}/v1/search?q=a%00")).bearer_auth(TOKEN), 400),
        ("/v1/search", http.get(format!("{base}/v1/search?q=a&q=b")).bearer_auth(TOKEN), 400),
        ("/v1/search", http.get(format!("{base}/v1/search?q={}", "y".repeat(4097))).bearer_auth(TOKEN), 400),
    ];
    for (path, request, expected) in cases {
        let request = request.build()?;
        let label = format!("{} {}", request.method(), request.url());
        let method = request.method().as_str().to_lowercase();
        let response = http.execute(request).await?;
        let status = response.status().as_u16();
        let content_type = response.headers().get("content-type").map(|v| v.to_str().unwrap_or_default().to_owned());
        let body: Value = response.json().await?;
        assert_eq!(status, expected, "{label}: {body}");
        assert_eq!(content_type.as_deref(), Some("application/problem+json"), "{label}");
        assert_eq!(body["status"], expected, "{label}: {body}");
        assert!(doc["paths"][path][&method]["responses"][status.to_string()].is_object(), "{label}: {status} is not documented");
    }
    let unknown = http.get(format!("{base}/v2/nothing")).send().await?;
    assert_eq!(unknown.status(), 404);
    assert_eq!(unknown.headers()["content-type"], "application/problem+json");
    let undocumented = http.put(format!("{base}/v1/exports/x")).bearer_auth(TOKEN).send().await?;
    assert_eq!(undocumented.status(), 405);
    assert_eq!(undocumented.headers()["content-type"], "application/problem+json");
    assert_eq!(undocumented.headers()["allow"], "GET,HEAD,DELETE");
    Ok(())
}

#[tokio::test]
async fn a_valid_request_gets_what_the_document_promises() -> anyhow::Result<()> {
    let api = api().await?;
    let http = reqwest::Client::new();
    let base = &api.base;
    let created = http
        .post(format!("{base}/v1/exports"))
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", " spaced key ")
        .json(&serde_json::json!({"format": "json", "query": "hello"}))
        .send()
        .await?;
    assert_eq!(created.status(), 202);
    let location = created.headers()["location"].to_str()?.to_owned();
    let body: Value = created.json().await?;
    assert_eq!(location, format!("/v1/exports/{}", body["job_id"].as_str().expect("job_id")));
    assert_eq!(body["status"], "pending");
    let job: Value = http.get(format!("{base}{location}")).bearer_auth(TOKEN).send().await?.json().await?;
    assert_eq!(job["query"], "hello");
    let found = http.get(format!("{base}/v1/search?q=hello")).bearer_auth(TOKEN).send().await?;
    assert_eq!(found.status(), 200);
    let found: Value = found.json().await?;
    assert!(found["hits"].is_array() && found["generation"].is_i64(), "{found}");
    Ok(())
}
