//! Every long-running role, as its own process, through the shared
//! cluster's SASL_SSL listeners (SCRAM-SHA-512, CA-verified) and
//! PostgreSQL with `sslmode=verify-full`, configured the way a deployment
//! is (`HERALD_*` variables), with a database password and an API token
//! that must never be shown: not in any process's stdout or stderr, not in
//! `/status`, `/status.json` or `/metrics`, not in `herald status`.
//!
//! The roles log at `debug` and `serve` at `trace`. A level's output is a
//! subset of every more verbose level's (the filter only drops lines), so
//! the `trace` run covers `error` through `trace` for `serve`, which starts
//! every role in one process.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use herald_store::Db;
use herald_testkit::{SecureBroker, postgres_db, postgres_tls, secure_broker, unique, wait_until, with_tls};
use tokio::process::{Child, Command};

const PATIENCE: Duration = Duration::from_secs(180);

/// The secrets of one run, random so no other text contains them by chance.
struct Secrets {
    db_password: String,
    token: String,
    kafka_password: String,
    observer: String,
}

impl Secrets {
    fn assert_absent(&self, what: &str, text: &str) {
        let secrets = [
            ("database password", &self.db_password),
            ("API token", &self.token),
            ("Kafka password", &self.kafka_password),
            ("observer token", &self.observer),
        ];
        for (name, secret) in secrets {
            assert!(!text.contains(secret.as_str()), "the {name} appears in {what}:\n{}", excerpt(text, secret));
        }
    }
}

fn excerpt(text: &str, secret: &str) -> String {
    let at = text.find(secret).unwrap_or(0);
    let start = text[..at].char_indices().rev().nth(200).map_or(0, |(i, _)| i);
    text[start..].chars().take(400).collect()
}

/// One deployment: its database, broker settings, topics and groups.
struct Deployment {
    env: Vec<(&'static str, String)>,
    dir: tempfile::TempDir,
    secrets: Secrets,
    db: Db,
}

async fn deployment(broker: &SecureBroker) -> anyhow::Result<Deployment> {
    let test_db = postgres_db().await?;
    let tls = postgres_tls()?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let secrets = Secrets {
        db_password: format!("dbpw-{}", uuid::Uuid::new_v4().simple()),
        token: format!("tok-{}", uuid::Uuid::new_v4().simple()),
        kafka_password: broker.password.clone(),
        observer: format!("obs-{}", uuid::Uuid::new_v4().simple()),
    };
    // The test server trusts local connections, so the password is carried
    // (and must be hidden) without being checked.
    let with_password =
        test_db.url.replacen("postgres://postgres@127.0.0.1:", &format!("postgres://postgres:{}@localhost:", secrets.db_password), 1);
    anyhow::ensure!(with_password != test_db.url, "unexpected test database URL {}", test_db.url);
    let dir = tempfile::tempdir()?;
    let mut env = broker.env("SCRAM-SHA-512");
    env.extend([
        ("HERALD_DATABASE_URL", with_tls(&with_password, "verify-full", Some(&tls.ca))?),
        ("HERALD_API_TOKENS", format!("{}:alice", secrets.token)),
        ("HERALD_OBSERVE_TOKEN", secrets.observer.clone()),
        ("HERALD_TOPIC_PREFIX", unique("secure")),
        ("HERALD_GROUP_PREFIX", unique("secure")),
        ("HERALD_ARTIFACTS", dir.path().join("artifacts").display().to_string()),
    ]);
    Ok(Deployment { env, dir, secrets, db })
}

/// A `herald` process whose stdout and stderr go to files.
struct Role {
    name: String,
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Deployment {
    fn start(&self, name: &str, level: &str, args: &[&str]) -> anyhow::Result<Role> {
        let (out, err) = (self.dir.path().join(format!("{name}.out")), self.dir.path().join(format!("{name}.err")));
        let mut command = Command::new(env!("CARGO_BIN_EXE_herald"));
        command.args(args).stdin(Stdio::null()).stdout(std::fs::File::create(&out)?).stderr(std::fs::File::create(&err)?);
        command.env_remove("HERALD_LOG").env("RUST_LOG", level).env("NO_COLOR", "1").envs(self.env.iter().cloned()).kill_on_drop(true);
        Ok(Role { name: name.to_owned(), child: command.spawn()?, out, err })
    }

    /// A command that runs to its end, with this deployment's settings:
    /// its exit code and stdout, once neither output shows a secret.
    async fn run_once(&self, args: &[&str], level: &str) -> anyhow::Result<(Option<i32>, String)> {
        let mut command = Command::new(env!("CARGO_BIN_EXE_herald"));
        command.args(args).env_remove("HERALD_LOG").env("RUST_LOG", level).envs(self.env.iter().cloned());
        let out = command.output().await?;
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        self.secrets.assert_absent(&format!("herald {args:?} at {level} (stdout)"), &stdout);
        self.secrets.assert_absent(&format!("herald {args:?} at {level} (stderr)"), &stderr);
        Ok((out.status.code(), stdout.into_owned()))
    }

    /// `herald status --json` through the secure listener: its output, checked.
    async fn status(&self, level: &str) -> anyhow::Result<serde_json::Value> {
        let (code, stdout) = self.run_once(&["status", "--json"], level).await?;
        anyhow::ensure!(code == Some(0), "herald status exited with {code:?}");
        Ok(serde_json::from_str(&stdout)?)
    }

    /// The observation pages of the API at `base`, each checked.
    async fn check_pages(&self, base: &str) -> anyhow::Result<()> {
        let http = reqwest::Client::new();
        for page in ["/status", "/status.json", "/metrics"] {
            let body =
                http.get(format!("{base}{page}")).bearer_auth(&self.secrets.observer).send().await?.error_for_status()?.text().await?;
            self.secrets.assert_absent(page, &body);
        }
        Ok(())
    }
}

/// Stops `role` with SIGTERM, waits, and checks everything it printed.
async fn stop_and_check(mut role: Role, secrets: &Secrets) -> anyhow::Result<()> {
    if let Some(pid) = role.child.id() {
        std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status()?;
    }
    let status = tokio::time::timeout(Duration::from_secs(60), role.child.wait()).await??;
    let (out, err) = (std::fs::read_to_string(&role.out)?, std::fs::read_to_string(&role.err)?);
    secrets.assert_absent(&format!("{} stdout", role.name), &out);
    secrets.assert_absent(&format!("{} stderr", role.name), &err);
    assert!(status.success(), "{} exited with {status} after SIGTERM:\n{err}", role.name);
    Ok(())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Requests one export as alice and waits until search (a consumer through
/// SASL_SSL) lists it, which needs the relay, the worker and the consumer.
async fn export_reaches_search(base: &str, token: &str, query: &str) -> anyhow::Result<String> {
    let http = reqwest::Client::new();
    let created: serde_json::Value = http
        .post(format!("{base}/v1/exports"))
        .bearer_auth(token)
        .header("Idempotency-Key", unique("key"))
        .json(&serde_json::json!({"format": "csv", "query": query}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let job_id = created["job_id"].as_str().unwrap_or_default().to_owned();
    anyhow::ensure!(!job_id.is_empty(), "no job id in {created}");
    wait_until("the export to be searchable", PATIENCE, || {
        let (http, job_id) = (http.clone(), job_id.clone());
        async move {
            let found = http.get(format!("{base}/v1/search?q={query}")).bearer_auth(token).send().await?.text().await?;
            Ok(found.contains(&job_id))
        }
    })
    .await?;
    Ok(job_id)
}

async fn wait_healthy(base: &str) -> anyhow::Result<()> {
    wait_until("the API to answer", PATIENCE, || async move {
        Ok(reqwest::get(format!("{base}/healthz")).await.is_ok_and(|r| r.status().is_success()))
    })
    .await
}

async fn sent_notifications(db: &Db, job_id: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM notification_intents WHERE job_id = $1 AND status = 'sent'")
        .bind(job_id)
        .fetch_one(db.pool())
        .await?)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_role_runs_through_sasl_ssl_and_verify_full_and_shows_no_secret() -> anyhow::Result<()> {
    let broker = secure_broker()?;
    let deployment = deployment(&broker).await?;
    let (api_port, sim_port) = (free_port()?, free_port()?);
    let (base, sim) = (format!("http://127.0.0.1:{api_port}"), format!("http://127.0.0.1:{sim_port}"));
    let ledger = deployment.dir.path().join("ledger.sqlite").display().to_string();
    let level = "debug";
    let roles = vec![
        deployment.start("provider-sim", level, &["provider-sim", "--ledger", &ledger, "--listen", &format!("127.0.0.1:{sim_port}")])?,
        deployment.start("api", level, &["api", "--listen", &format!("127.0.0.1:{api_port}")])?,
        deployment.start("worker", level, &["worker"])?,
        deployment.start("relay", level, &["relay"])?,
        deployment.start("consume-search", level, &["consume", "search"])?,
        deployment.start("consume-stats", level, &["consume", "stats"])?,
        deployment.start("consume-notify", level, &["consume", "notify", "--start-at", "latest"])?,
        deployment.start(
            "dispatch",
            level,
            &["dispatch", "--notify-url", &sim, "--notify-idempotent", "true", "--notify-queryable", "true"],
        )?,
    ];
    wait_healthy(&base).await?;
    let job_id = export_reaches_search(&base, &deployment.secrets.token, "secure").await?;
    // The notify consumer and the dispatcher, through the same listener.
    wait_until("the completion to be notified", PATIENCE, || async { Ok(sent_notifications(&deployment.db, &job_id).await? == 1) }).await?;
    deployment.check_pages(&base).await?;
    for level in ["info", "debug", "trace"] {
        let status = deployment.status(level).await?;
        assert!(status["kafka_error"].is_null(), "herald status reached the brokers: {status}");
        let lagged = status["subscriptions"].as_array().is_some_and(|subs| subs.iter().all(|s| s["lag"].is_number()));
        assert!(lagged, "lag measured through SASL_SSL for every subscription: {status}");
    }
    for role in roles {
        stop_and_check(role, &deployment.secrets).await?;
    }
    // The commands that run to an end, on the same settings.
    let (code, _) = deployment.run_once(&["rebuild", "search", "--json"], "debug").await?;
    assert_eq!(code, Some(0), "a rebuild replays the history through SASL_SSL");
    let (code, _) = deployment
        .run_once(&["snapshot", "search", "--out", &deployment.dir.path().join("search.snapshot").display().to_string()], "debug")
        .await?;
    assert_eq!(code, Some(0), "a snapshot reads the group's positions through SASL_SSL");
    let (code, report) = deployment.run_once(&["audit", "--json"], "debug").await?;
    assert_eq!(code, Some(0), "the audit reads the topics through SASL_SSL and finds every invariant held: {report}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_at_trace_shows_no_secret() -> anyhow::Result<()> {
    let broker = secure_broker()?;
    let deployment = deployment(&broker).await?;
    let port = free_port()?;
    let base = format!("http://127.0.0.1:{port}");
    let serve = deployment.start("serve", "trace", &["serve", "--listen", &format!("127.0.0.1:{port}"), "--notify-start-at", "latest"])?;
    wait_healthy(&base).await?;
    export_reaches_search(&base, &deployment.secrets.token, "traced").await?;
    deployment.check_pages(&base).await?;
    stop_and_check(serve, &deployment.secrets).await
}

/// `herald <args>` with the secure listener's flags but `mechanism`, the
/// password and the CA replaced as given: its exit code and stderr.
async fn refused(
    broker: &SecureBroker,
    args: &[&str],
    mechanism: &str,
    password: &str,
    ca: &Path,
) -> anyhow::Result<(Option<i32>, String)> {
    let test_db = postgres_db().await?;
    // Roles check the schema and leave migrating to `herald migrate`.
    herald_store::Db::connect_and_migrate(&test_db.url).await?.close().await;
    let mut flags = broker.flags(mechanism);
    let at = |flag: &str, flags: &[String]| flags.iter().position(|f| f == flag).map(|i| i + 1).unwrap_or_default();
    let password_at = at("--kafka-sasl-password", &flags);
    flags[password_at] = password.to_owned();
    let ca_at = at("--kafka-ssl-ca", &flags);
    flags[ca_at] = ca.display().to_string();
    let mut command = Command::new(env!("CARGO_BIN_EXE_herald"));
    command.args(args).args(&flags).args(["--database", &test_db.url]).env("RUST_LOG", "debug").env_remove("HERALD_LOG");
    for var in ["HERALD_DATABASE_URL", "HERALD_KAFKA_BROKERS", "HERALD_TOPIC_PREFIX"] {
        command.env_remove(var);
    }
    // Bounded: the point is that a refusal is not a hang.
    let out = tokio::time::timeout(Duration::from_secs(90), command.output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains(password) && !String::from_utf8_lossy(&out.stdout).contains(password), "the password is shown:\n{stderr}");
    Ok((out.status.code(), stderr))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_password_is_refused_at_start_with_exit_2() -> anyhow::Result<()> {
    let broker = secure_broker()?;
    let wrong = format!("wrong-{}", uuid::Uuid::new_v4().simple());
    for (args, mechanism) in [(&["relay"][..], "SCRAM-SHA-512"), (&["consume", "search"][..], "PLAIN"), (&["status"][..], "SCRAM-SHA-512")]
    {
        let (code, stderr) = refused(&broker, args, mechanism, &wrong, &broker.ca).await?;
        assert_eq!(code, Some(2), "{args:?} with {mechanism}: exit 2 for refused credentials:\n{stderr}");
        assert!(stderr.contains("refused the credentials"), "{args:?}: says why:\n{stderr}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_untrusted_ca_is_refused_at_start_with_exit_2() -> anyhow::Result<()> {
    let broker = secure_broker()?;
    for args in [&["relay"][..], &["status"][..]] {
        let (code, stderr) = refused(&broker, args, "SCRAM-SHA-512", &broker.password, &broker.untrusted_ca).await?;
        assert_eq!(code, Some(2), "{args:?}: exit 2 for an untrusted certificate:\n{stderr}");
        assert!(stderr.contains("TLS to Kafka failed"), "{args:?}: says why:\n{stderr}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_works_as_scram_does() -> anyhow::Result<()> {
    let broker = secure_broker()?;
    let test_db = postgres_db().await?;
    Db::connect_and_migrate(&test_db.url).await?;
    // Topics of its own: `status` reads every Herald topic, and the shared
    // cluster has the default ones only if another test made them first.
    let prefix = unique("plain");
    let topics = herald_kafka::Topics::with_prefix(&prefix);
    let plain = herald_kafka::KafkaConfig::new(herald_testkit::real_broker()?);
    herald_kafka::ensure_topics(&plain, &topics.all(), herald_kafka::TopicSettings::partitions(1)).await?;
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["status", "--json", "--database", &test_db.url, "--topic-prefix", &prefix])
        .args(broker.flags("PLAIN"))
        .env_remove("HERALD_KAFKA_BROKERS")
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: serde_json::Value = serde_json::from_str(&stdout)?;
    assert!(status["kafka_error"].is_null(), "reached the brokers with PLAIN: {status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_ca_that_does_not_match_is_refused_with_exit_2() -> anyhow::Result<()> {
    let test_db = postgres_db().await?;
    let tls = postgres_tls()?;
    let password = format!("dbpw-{}", uuid::Uuid::new_v4().simple());
    let url = test_db.url.replacen("postgres://postgres@127.0.0.1:", &format!("postgres://postgres:{password}@localhost:"), 1);
    let url = with_tls(&url, "verify-full", Some(&tls.untrusted_ca))?;
    for args in [&["status"][..], &["relay", "--kafka", "127.0.0.1:9"][..], &["migrate"][..]] {
        let out =
            Command::new(env!("CARGO_BIN_EXE_herald")).args(args).args(["--database", &url]).env("RUST_LOG", "debug").output().await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}:\n{stderr}");
        assert!(stderr.contains("TLS to the database failed"), "{args:?}: says why:\n{stderr}");
        assert!(!stderr.contains(&password), "{args:?}: the password is shown:\n{stderr}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn help_hides_the_values_of_secret_variables() -> anyhow::Result<()> {
    let secret = format!("s3cret-{}", uuid::Uuid::new_v4().simple());
    let secret_vars = [
        ("HERALD_DATABASE_URL", format!("postgres://herald:{secret}@db.internal/herald")),
        ("HERALD_KAFKA_SASL_PASSWORD", secret.clone()),
        ("HERALD_API_TOKENS", format!("{secret}:alice")),
        ("HERALD_KAFKA_PROPERTIES", format!("ssl.key.password={secret}")),
        ("HERALD_DRILL_TOKEN", secret.clone()),
    ];
    for command in ["serve", "api", "worker", "relay", "consume", "dispatch", "status", "rebuild", "audit", "drill", "migrate"] {
        let out = Command::new(env!("CARGO_BIN_EXE_herald")).args([command, "--help"]).envs(secret_vars.iter().cloned()).output().await?;
        let shown = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{command} --help: {shown}");
        assert!(!shown.contains(&secret), "`herald {command} --help` shows a secret variable's value:\n{}", excerpt(&shown, &secret));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_token_entry_is_refused_without_being_echoed() -> anyhow::Result<()> {
    let db = herald_testkit::sqlite_db()?;
    // Roles check the schema and leave migrating to `herald migrate`.
    herald_store::Db::connect_and_migrate(&db.url).await?.close().await;
    let token = format!("s3cret-{}", uuid::Uuid::new_v4().simple());
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["api", "--listen", "127.0.0.1:0", "--database", &db.url, "--tokens", &format!("fine:alice,{token}")])
        .env_remove("HERALD_KAFKA_BROKERS")
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("entry 2"), "names the entry by position: {stderr}");
    assert!(!stderr.contains(&token) && !String::from_utf8_lossy(&out.stdout).contains(&token), "echoed: {stderr}");
    Ok(())
}
