//! Only `herald migrate` changes the schema, and every role checks at start
//! that it may run on what it finds, on both databases: no schema, an older
//! one, a newer one that only expanded (runs), a newer one a contract
//! migration closed to this release (refused), each refusal exit 2 with the
//! version found, the version needed and what to run.

use std::borrow::Cow;
use std::process::{Command, Output};

use herald_store::{Db, schema};
use sqlx::migrate::Migrator;

fn herald(args: &[&str], url: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(args)
        .args(["--database", url])
        .env("HERALD_LOG", "warn")
        .env_remove("HERALD_DATABASE_URL")
        .output()
        .expect("run herald")
}

/// A role that reads the database and exits: the outbox list.
fn a_role(url: &str) -> Output {
    herald(&["outbox", "list", "--status", "pending"], url)
}

fn refused(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "`{needle}` missing from: {stderr}");
    }
}

fn ran(out: &Output) {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// What a later release's expanding migration leaves behind.
async fn a_later_release_migrated(url: &str, version: i64, readers_from: i64) -> anyhow::Result<()> {
    let db = Db::connect(url).await?;
    sqlx::query("INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES ($1, 'later', TRUE, $2, 0)")
        .bind(version)
        .bind(vec![0u8; 48])
        .execute(db.pool())
        .await?;
    sqlx::query("INSERT INTO schema_phases (version, phase, readers_from) VALUES ($1, $2, $3)")
        .bind(version)
        .bind(if readers_from > 16 { "contract" } else { "expand" })
        .bind(readers_from)
        .execute(db.pool())
        .await?;
    db.close().await;
    Ok(())
}

async fn roles_check_the_schema(url: &str) -> anyhow::Result<()> {
    let probe = Db::connect(url).await?;
    let knows = schema::newest_known(&probe);
    let shipped = probe.migrator().iter().count();
    probe.close().await;

    refused(&a_role(url), &["no Herald schema", &format!("version {knows}"), "herald migrate"]);
    let out = herald(&["migrate", "--dry-run"], url);
    ran(&out);
    let listed = String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("  ")).count();
    assert_eq!(listed, shipped, "{}", String::from_utf8_lossy(&out.stdout));
    refused(&a_role(url), &["no Herald schema"]);

    // One release back: every migration but the newest, as the previous
    // release's `herald migrate` left it.
    let db = Db::connect(url).await?;
    let all = db.migrator();
    let previous = Migrator { migrations: Cow::Owned(all.migrations[..all.migrations.len() - 1].to_vec()), ..Migrator::DEFAULT };
    previous.run(db.pool()).await?;
    db.close().await;
    refused(&a_role(url), &[&format!("at version {}", knows - 1), &format!("needs version {knows}"), "herald migrate"]);
    ran(&herald(&["migrate"], url));
    ran(&a_role(url));

    // A later release expanded the schema: this one still runs, and its
    // own migrate changes nothing.
    a_later_release_migrated(url, knows + 5, 16).await?;
    ran(&a_role(url));
    refused(&herald(&["migrate"], url), &[&format!("version {}", knows + 5), "nothing to apply"]);
    ran(&herald(&["migrate", "--dry-run"], url));

    // A later release contracted what this one reads.
    a_later_release_migrated(url, knows + 6, knows + 1).await?;
    refused(&a_role(url), &[&format!("at version {}", knows + 6), &format!("version {} or later", knows + 1), "newer release"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn roles_check_the_schema_on_sqlite() -> anyhow::Result<()> {
    let db = herald_testkit::sqlite_db()?;
    roles_check_the_schema(&db.url).await
}

#[tokio::test(flavor = "multi_thread")]
async fn roles_check_the_schema_on_postgres() -> anyhow::Result<()> {
    let db = herald_testkit::postgres_db().await?;
    roles_check_the_schema(&db.url).await
}
