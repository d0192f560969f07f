//! `herald migrate [--dry-run]`: the one command that changes the database
//! schema. Every role only checks that it may run on what it finds
//! (`herald_store::schema`), so an upgrade is: migrate with the new release,
//! then restart roles one at a time (README, "Upgrading").

use std::process::ExitCode;

use clap::Args;
use herald_store::schema;
use herald_wiring::connection::{DatabaseArgs, Schema};

#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// List the migrations this release would apply, and apply none.
    #[arg(long)]
    pub dry_run: bool,
}

pub async fn run(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let url = args.database.require("herald migrate")?;
    let db = args.database.open("herald migrate", Schema::AsIs).await?;
    let pending = schema::pending(&db).await?;
    let found = schema::found(&db).await?;
    let knows = schema::newest_known(&db);
    if let Some(applied) = found.applied.filter(|applied| *applied > knows) {
        let text = format!("{url}: schema at version {applied}, newer than this release's {knows}: nothing to apply");
        if args.dry_run {
            println!("{text}");
            return Ok(ExitCode::SUCCESS);
        }
        // Running an older release's migrate after a newer one is a mistake
        // in the upgrade order: say so, change nothing.
        eprintln!("error: {text} (migrate with the newer release)");
        return Ok(ExitCode::from(2));
    }
    if pending.is_empty() {
        println!("{url}: schema at version {knows}: nothing to apply");
        return Ok(ExitCode::SUCCESS);
    }
    let verb = if args.dry_run { "would apply" } else { "applying" };
    println!("{url}: {verb} {} migration(s):", pending.len());
    for (version, description) in &pending {
        println!("  {version:04} {description}");
    }
    if let Some(version) = found.failed {
        eprintln!(
            "error: {url}: migration {version} failed half way: finish or undo it by hand and delete its row in _sqlx_migrations first"
        );
        return Ok(ExitCode::from(2));
    }
    if !args.dry_run {
        // On the pool already open: the migrator's lock (PostgreSQL) is
        // what keeps two concurrent `herald migrate` runs apart.
        db.migrate().await.map_err(|e| herald_wiring::connection::BadConnection(format!("database {url}: {e}")))?;
        println!("{url}: schema at version {knows}");
    }
    Ok(ExitCode::SUCCESS)
}
