//! The provider's status classes, one test per row of ARCHITECTURE.md's
//! table, through a real dispatcher, a provider on loopback and both
//! databases: 429/408/425 retried with the same key not before Retry-After;
//! 401/403 pause with intents untouched; other 4xx `failed` (409 `conflict`)
//! and `herald notify redrive` requeues them as an operator's act; 5xx is
//! "may have executed" unless declared safe.

#[macro_use]
mod notify_support;

use std::process::Command;
use std::time::Duration;

use herald_notify::dispatcher::{DispatchError, Dispatcher};
use herald_notify::provider::Capabilities;
use herald_store::Db;
use notify_support::{BODY, Backend, Scripted, TestProvider, database, db_now, dispatcher, make_due, row, seed};
use tokio_util::sync::CancellationToken;

const HOUR: Duration = Duration::from_secs(3600);

fn quick(db: &Db, provider: &TestProvider, caps: Capabilities) -> anyhow::Result<Dispatcher> {
    dispatcher(db, &provider.url, caps, Duration::from_secs(30), Duration::from_secs(5), 10)
}

async fn once(d: &Dispatcher) -> anyhow::Result<usize> {
    Ok(d.dispatch_once(&CancellationToken::new()).await?)
}

fn keys_called(provider: &TestProvider, key: &str) -> Vec<String> {
    provider.calls().into_iter().filter(|c| c.key == key).map(|c| c.body).collect()
}

async fn retry_later(backend: Backend) -> anyhow::Result<()> {
    let (test_db, db) = database(backend).await?;
    let provider = TestProvider::start(&test_db.url, false, false).await?;
    // Unkeyed on purpose: these answers prove nothing executed, so even a
    // provider without keys gets the retry.
    let d = quick(&db, &provider, Capabilities::unkeyed())?;
    for (i, status) in [429u16, 408, 425].into_iter().enumerate() {
        let key = format!("ntf_{status}");
        seed(&db, &key, i as i64).await?;
        provider.script([Scripted::retry_after(status, 120)]);
        let before = db_now(&db).await?;
        assert_eq!(once(&d).await?, 1);
        let waiting = row(&db, &key).await?;
        assert_eq!(waiting.status, "pending", "{status}: {waiting:?}");
        assert!(waiting.last_error.as_deref().is_some_and(|e| e.starts_with(&status.to_string())), "{waiting:?}");
        let wait = waiting.next_attempt_at_ms - before;
        assert!((120_000..125_000).contains(&wait), "{status}: Retry-After 120 s honoured, got {wait} ms");
        assert_eq!(once(&d).await?, 0, "{status}: not due before Retry-After");
        make_due(&db, &key).await?;
        assert_eq!(once(&d).await?, 1);
        assert_eq!(row(&db, &key).await?.status, "sent");
        assert_eq!(keys_called(&provider, &key), [BODY, BODY], "{status}: the same key and body twice");
    }
    Ok(())
}

on_both!(retry_later_429_408_425_honours_retry_after, retry_later);

async fn credentials(backend: Backend) -> anyhow::Result<()> {
    let (test_db, db) = database(backend).await?;
    seed(&db, "ntf_a", 1).await?;
    seed(&db, "ntf_b", 2).await?;
    let provider = TestProvider::start(&test_db.url, true, false).await?;
    let d = quick(&db, &provider, Capabilities::keyed(HOUR))?;
    for status in [401u16, 403] {
        provider.script([Scripted::status(status)]);
        let calls_before = provider.calls().len();
        let err = d.dispatch_once(&CancellationToken::new()).await.expect_err("a configuration problem");
        assert!(matches!(&err, DispatchError::CredentialsRefused { reason } if reason.starts_with(&status.to_string())), "{err}");
        assert_eq!(provider.calls().len(), calls_before + 1, "{status}: paused at the first refusal, the rest of the batch not called");
        for key in ["ntf_a", "ntf_b"] {
            let intent = row(&db, key).await?;
            let untouched = (intent.status.as_str(), intent.attempts, &intent.claim_token, intent.first_attempt_at_ms, &intent.last_error);
            assert_eq!(untouched, ("pending", 0, &None, None, &None), "{status}: {key} left as it was");
        }
    }
    assert_eq!(once(&d).await?, 2, "credentials fixed: both go out");
    Ok(())
}

on_both!(credentials_refused_pauses_with_intents_untouched, credentials);

fn redrive(url: &str, args: &[&str]) -> anyhow::Result<(Option<i32>, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["notify", "redrive", "--database", url, "--operator", "ops"])
        .args(args)
        .env_remove("HERALD_DATABASE_URL")
        .output()?;
    Ok((out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))))
}

async fn refused_then_redriven(backend: Backend) -> anyhow::Result<()> {
    let (test_db, db) = database(backend).await?;
    let provider = TestProvider::start(&test_db.url, true, false).await?;
    let d = quick(&db, &provider, Capabilities::keyed(HOUR))?;
    for (i, key) in ["ntf_400", "ntf_422", "ntf_409"].into_iter().enumerate() {
        seed(&db, key, i as i64).await?;
    }
    provider.script([Scripted::status(400), Scripted::status(422), Scripted::status(409)]);
    assert_eq!(once(&d).await?, 3);
    let statuses = [row(&db, "ntf_400").await?.status, row(&db, "ntf_422").await?.status, row(&db, "ntf_409").await?.status];
    assert_eq!(statuses, ["failed", "failed", "conflict"]);
    assert_eq!(once(&d).await?, 0, "nothing resends a refusal on its own");

    let url = &test_db.url;
    let (code, out) = redrive(url, &["--key", "ntf_400"])?;
    assert_eq!(code, Some(0), "{out}");
    let requeued = row(&db, "ntf_400").await?;
    assert_eq!(
        (requeued.status.as_str(), requeued.resolved_by.as_deref()),
        ("pending", Some("operator:ops")),
        "recorded as the operator's act"
    );
    assert_eq!(redrive(url, &["--status", "conflict"])?.0, Some(0));
    assert_eq!(row(&db, "ntf_409").await?.status, "pending");
    assert_eq!(row(&db, "ntf_422").await?.status, "failed", "only what was named");
    assert_eq!(redrive(url, &["--status", "failed", "--json"])?.0, Some(0));
    for bad in [&["--key", "ntf_400"][..], &["--key", "ntf_nope"], &[], &["--status", "sent"], &["--key", "k", "--status", "failed"]] {
        let (code, out) = redrive(url, bad)?;
        assert_eq!(code, Some(2), "{bad:?}: {out}");
        assert!(out.contains("error"), "{bad:?} explains itself: {out}");
    }
    assert_eq!(once(&d).await?, 3, "redriven intents go out again");
    for key in ["ntf_400", "ntf_422", "ntf_409"] {
        assert_eq!(row(&db, key).await?.status, "sent");
        assert_eq!(keys_called(&provider, key), [BODY, BODY], "{key}: same key and body");
    }
    Ok(())
}

on_both!(other_4xx_fail_and_redrive_requeues, refused_then_redriven);

async fn server_errors(backend: Backend) -> anyhow::Result<()> {
    let (test_db, db) = database(backend).await?;
    let provider = TestProvider::start(&test_db.url, true, false).await?;
    let cases = [
        ("ntf_unkeyed", Capabilities::unkeyed(), 503u16, "unknown"),
        ("ntf_safe", Capabilities { server_errors_safe: true, ..Capabilities::unkeyed() }, 503, "pending"),
        ("ntf_keyed", Capabilities::keyed(HOUR), 504, "pending"),
        ("ntf_forgotten", Capabilities::keyed(Duration::from_millis(1)), 502, "unknown"),
    ];
    for (i, (key, caps, status, after)) in cases.into_iter().enumerate() {
        seed(&db, key, i as i64).await?;
        let d = quick(&db, &provider, caps)?;
        provider.script([Scripted::status(status)]);
        assert_eq!(once(&d).await?, 1);
        assert_eq!(row(&db, key).await?.status, after, "{key} after {status}");
        make_due(&db, key).await?;
        once(&d).await?;
        let (calls, effects) = (keys_called(&provider, key).len(), provider.effects_of(key).await?);
        match after {
            "unknown" => {
                assert_eq!((calls, row(&db, key).await?.status.as_str()), (1, "unknown"), "{key}: may have executed, never resent")
            }
            _ => assert_eq!((calls, effects, row(&db, key).await?.status.as_str()), (2, 1, "sent"), "{key}: retried with the same key"),
        }
    }
    Ok(())
}

on_both!(server_errors_may_have_executed_unless_declared_safe, server_errors);
