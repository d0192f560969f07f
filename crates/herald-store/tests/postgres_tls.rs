//! TLS to PostgreSQL against the test server, which runs with `ssl=on` and a
//! certificate for the name `localhost` signed by a test CA: each
//! `sslmode` does what libpq's does, and a wrong CA is refused at connect
//! with a configuration error (not retried, not ignored).

use herald_store::{Db, StoreError};
use herald_testkit::{postgres_db, postgres_tls, with_tls};
use sqlx::Row;

/// Whether this session of `db`'s pool runs over TLS, by the server's word.
async fn over_tls(db: &Db) -> anyhow::Result<bool> {
    let row = sqlx::query("SELECT CAST(ssl AS INTEGER) AS ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetch_one(db.pool()).await?;
    Ok(row.try_get::<i32, _>("ssl")? == 1)
}

/// The test database's URL by the name its certificate carries.
fn by_name(url: &str) -> anyhow::Result<String> {
    let named = url.replacen("@127.0.0.1:", "@localhost:", 1);
    anyhow::ensure!(named != url, "the test server is expected on 127.0.0.1: {url}");
    Ok(named)
}

#[tokio::test]
async fn verify_full_connects_with_the_servers_ca() -> anyhow::Result<()> {
    let test_db = postgres_db().await?;
    let tls = postgres_tls()?;
    let db = Db::connect_and_migrate(&with_tls(&by_name(&test_db.url)?, "verify-full", Some(&tls.ca))?).await?;
    assert!(over_tls(&db).await?, "verify-full must run over TLS");
    let db = Db::connect(&with_tls(&test_db.url, "verify-ca", Some(&tls.ca))?).await?;
    assert!(over_tls(&db).await?, "verify-ca must run over TLS");
    // `require` encrypts without checking the certificate, as libpq's does.
    let db = Db::connect(&with_tls(&test_db.url, "require", None)?).await?;
    assert!(over_tls(&db).await?, "require must run over TLS");
    Ok(())
}

#[tokio::test]
async fn the_default_prefers_tls_as_libpq_does() -> anyhow::Result<()> {
    let test_db = postgres_db().await?;
    assert!(!test_db.url.contains("sslmode"), "the test URL names no sslmode: {}", test_db.url);
    let db = Db::connect(&test_db.url).await?;
    assert!(over_tls(&db).await?, "with no sslmode, a server that offers TLS gets TLS (prefer)");
    let db = Db::connect(&with_tls(&test_db.url, "disable", None)?).await?;
    assert!(!over_tls(&db).await?, "sslmode=disable stays in plain text");
    Ok(())
}

#[tokio::test]
async fn a_wrong_ca_is_refused_as_a_configuration_error() -> anyhow::Result<()> {
    let test_db = postgres_db().await?;
    let tls = postgres_tls()?;
    for mode in ["verify-full", "verify-ca"] {
        let url = with_tls(&by_name(&test_db.url)?, mode, Some(&tls.untrusted_ca))?;
        match Db::connect(&url).await {
            Err(StoreError::Config(reason)) => assert!(reason.contains("TLS"), "{mode}: says TLS failed: {reason}"),
            Err(other) => panic!("{mode}: a refused certificate is a configuration error, got {other}"),
            Ok(_) => panic!("{mode}: connected although the server's certificate is not signed by the given CA"),
        }
    }
    Ok(())
}

#[tokio::test]
async fn verify_full_checks_the_host_name() -> anyhow::Result<()> {
    let test_db = postgres_db().await?;
    let tls = postgres_tls()?;
    // 127.0.0.1 reaches the same server, but the certificate names only
    // localhost: verify-full refuses, verify-ca (no host check) accepts.
    let by_address = &test_db.url;
    assert!(matches!(Db::connect(&with_tls(by_address, "verify-full", Some(&tls.ca))?).await, Err(StoreError::Config(_))));
    let db = Db::connect(&with_tls(by_address, "verify-ca", Some(&tls.ca))?).await?;
    assert!(over_tls(&db).await?);
    Ok(())
}
