//! A PostgreSQL database of its own for one benchmark or drill run, created
//! next to the operator's and dropped afterwards (a drill keeps it, as
//! evidence), so a run never mixes its rows with anything else.

use std::future::Future;
use std::process::ExitCode;

use anyhow::Context;
use herald_secret::SecretUrl;
use sqlx::{Connection, Executor, PgConnection};

pub struct ScratchDb {
    /// The new database's URL (the server's, password included).
    pub url: SecretUrl,
    server: SecretUrl,
    name: String,
}

impl ScratchDb {
    /// Creates `<prefix>_<uuid>` on the server of `server` (a PostgreSQL URL).
    pub async fn create(server: &SecretUrl, prefix: &str) -> anyhow::Result<ScratchDb> {
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let mut admin = PgConnection::connect(server.expose()).await.with_context(|| format!("connecting to {server}"))?;
        admin.execute(format!("CREATE DATABASE \"{name}\"").as_str()).await.with_context(|| format!("creating database {name}"))?;
        admin.close().await.ok();
        let mut url = url::Url::parse(server.expose()).with_context(|| format!("{server} is not a URL"))?;
        url.set_path(&name);
        Ok(ScratchDb { url: SecretUrl::new(url), server: server.clone(), name })
    }

    /// Drops the database, closing what is still connected; best effort.
    pub async fn drop_db(self) {
        if let Ok(mut admin) = PgConnection::connect(self.server.expose()).await {
            let _ = admin.execute(format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name).as_str()).await;
            let _ = admin.close().await;
        }
    }
}

/// Runs `measure` on a scratch database of the PostgreSQL server `database`
/// names, drops it whatever the outcome, and hands the figures to `emit`.
/// Exit 2 when no PostgreSQL server is named: the figures are meant to be
/// compared with a production database's.
pub async fn on_scratch_postgres<T, M, F>(
    database: Option<&SecretUrl>,
    measure: M,
    emit: impl FnOnce(T) -> anyhow::Result<()>,
) -> anyhow::Result<ExitCode>
where
    M: FnOnce(String) -> F,
    F: Future<Output = anyhow::Result<T>>,
{
    let Some(server) = database.filter(|u| u.expose().starts_with("postgres")) else {
        eprintln!("error: --database (or HERALD_DATABASE_URL) must name a PostgreSQL server (postgres://…)");
        return Ok(ExitCode::from(2));
    };
    let scratch = ScratchDb::create(server, "herald_bench").await?;
    let result = measure(scratch.url.expose().to_owned()).await;
    scratch.drop_db().await;
    emit(result?)?;
    Ok(ExitCode::SUCCESS)
}
