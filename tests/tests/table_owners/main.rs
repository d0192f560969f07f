//! Each table has one owning crate, which holds every production statement
//! writing it; other crates write through its functions. This test reads the
//! owners from ARCHITECTURE.md ("Tables and their owners"), scans every `.rs`
//! file under `crates/*/src` for `INSERT`, `UPDATE`, `DELETE` and
//! `CREATE TABLE` statements, and fails naming each statement outside its
//! table's owner, each table without an owner (created by a migration or by
//! code), and each owner entry for a table nothing creates. No database.
//!
//! Not scanned: `tests/`, `benches/` and migrations (outside `crates/*/src`),
//! unit-test files and `#[cfg(test)]` items inside it, and [`EXEMPT`].

mod scan;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Files allowed to write tables they do not own, each with its reason.
const EXEMPT: &[(&str, &str)] = &[
    (
        "crates/herald-proof/src/bench/consume.rs",
        "benchmark ceiling: raw multi-row inserts into inbox and search_documents, the bound the consumer is measured against",
    ),
    (
        "crates/herald-proof/src/bench/rebuild_floor.rs",
        "benchmark floor: the rebuild benchmark's documents copied into a table of the run's own (dropped after), \
         the least the server does to make them searchable; not a production path",
    ),
    ("crates/herald-proof/src/bench/relay.rs", "benchmark baseline: the naive relay marks outbox rows delivered one by one"),
    (
        "crates/herald-proof/src/bench/status.rs",
        "benchmark fixture: ten million outbox rows and the tables around them in generate_series statements, \
         relay cursors set as a relay's progress write sets them; not a production path",
    ),
    (
        "crates/herald-proof/src/bench/prune.rs",
        "benchmark fixture: a million old delivered outbox rows and inbox rows for a prune to remove, in generate_series \
         statements; not a production path",
    ),
    (
        "crates/herald-proof/src/bench/search_load.rs",
        "benchmark fixture: a million search documents in one generate_series statement, not a production path",
    ),
    (
        "crates/herald-proof/src/drill/upgrade/rebuild.rs",
        "drill fault injection: an uncommitted copy of one search document into the next generation holds the old \
         release's rebuild half way; the transaction is rolled back, never committed",
    ),
    (
        "crates/herald-projections/src/search/load.rs",
        "a search generation's own table, named by its generation (`search_documents_g<N>`): created and written by \
         the replay while it loads; once attached as that generation's partition of search_documents, live writes \
         name it (as they name search_documents_legacy for the generations it holds)",
    ),
    (
        "crates/herald-projections/src/search/seal.rs",
        "the same table at its seal: the rows of a job loaded twice that the version guard would not have kept \
         deleted, live traffic's rows of the generation merged in under the guard, then attached as the partition",
    ),
    (
        "crates/herald-store/src/lease.rs",
        "the generic lease primitive: writes the lease columns of the table its owner passes by name (format string); \
         the owner's own module calls it",
    ),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Table → owning crate, from the table under the heading "Tables and their
/// owners" in ARCHITECTURE.md: a row's first cell names the table, its second
/// the crate, both in backticks.
fn owners() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let section = text.split_once("### Tables and their owners").expect("ARCHITECTURE.md has a \"Tables and their owners\" section").1;
    let mut owners = BTreeMap::new();
    for line in section.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let code = |cell: &str| cell.strip_prefix('`').and_then(|c| c.strip_suffix('`')).map(str::to_owned);
        if let (Some(table), Some(owner)) = (code(cells[1]), cells.get(2).and_then(|c| code(c))) {
            assert!(owners.insert(table.clone(), owner).is_none(), "ARCHITECTURE.md names {table}'s owner twice");
        }
    }
    assert!(!owners.is_empty(), "no rows in ARCHITECTURE.md's \"Tables and their owners\"");
    owners
}

/// Crate directory under `crates/` → package name.
fn crates() -> BTreeMap<String, String> {
    let mut crates = BTreeMap::new();
    for dir in std::fs::read_dir(root().join("crates")).expect("crates/") {
        let dir = dir.expect("crates/ entry").path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else { continue };
        let name = manifest.lines().find_map(|l| l.strip_prefix("name = ")).expect("package name").trim_matches('"');
        crates.insert(dir.file_name().expect("dir name").to_string_lossy().into_owned(), name.to_owned());
    }
    crates
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Unit tests kept in their own file (`mod tests;`) or directory.
fn is_test_file(relative: &str) -> bool {
    relative.split('/').any(|part| part == "tests" || part == "tests.rs")
}

fn is_exempt(relative: &str) -> bool {
    EXEMPT.iter().any(|(path, _)| *path == relative)
}

fn migration_scripts(dialect: &str) -> Vec<String> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(root().join("migrations").join(dialect))
        .expect("migrations dir")
        .map(|e| e.expect("migration").path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    paths.sort();
    paths.iter().map(|p| std::fs::read_to_string(p).expect("migration")).collect()
}

#[test]
fn every_table_is_written_only_by_its_owner() {
    let owners = owners();
    let crates = crates();
    let mut problems = Vec::new();
    for owner in owners.values().collect::<BTreeSet<_>>() {
        if !crates.values().any(|c| c == owner) {
            problems.push(format!("ARCHITECTURE.md: owner {owner} is not a crate of crates/"));
        }
    }
    let mut created: BTreeSet<String> = BTreeSet::new();
    for dialect in ["postgres", "sqlite"] {
        for table in scan::migrated_tables(migration_scripts(dialect).iter().map(String::as_str)) {
            if !owners.contains_key(&table) {
                problems.push(format!("migrations/{dialect}: table {table} has no owner in ARCHITECTURE.md's \"Tables and their owners\""));
            }
            created.insert(table);
        }
    }
    for (dir, crate_name) in &crates {
        let mut files = Vec::new();
        rust_files(&root().join("crates").join(dir).join("src"), &mut files);
        files.sort();
        for file in files {
            let relative = file.strip_prefix(root()).expect("under the root").to_string_lossy().replace('\\', "/");
            if is_test_file(&relative) || is_exempt(&relative) {
                continue;
            }
            let source = std::fs::read_to_string(&file).expect("source file");
            let writes = scan::writes(&source);
            created.extend(writes.iter().filter(|w| w.verb == "CREATE TABLE").map(|w| w.table.clone()));
            problems.extend(misplaced(&owners, crate_name, &relative, &writes));
        }
    }
    for table in owners.keys().filter(|t| !created.contains(*t)) {
        problems.push(format!("ARCHITECTURE.md: {table} has an owner but no migration or production code creates it"));
    }
    assert!(problems.is_empty(), "table ownership (ARCHITECTURE.md, \"Tables and their owners\"):\n{}", problems.join("\n"));
}

/// The statements of `writes` (from `file` of `crate_name`) that write a
/// table another crate owns, no crate owns, or one named only at run time.
fn misplaced(owners: &BTreeMap<String, String>, crate_name: &str, file: &str, writes: &[scan::Write]) -> Vec<String> {
    let mut problems = Vec::new();
    for write in writes {
        let at = format!("{file}:{}: {} {}", write.line, write.verb, write.table);
        match owners.get(&write.table) {
            _ if write.is_dynamic() => problems.push(format!("{at}: a table named at run time; only the lease primitive may")),
            None => problems.push(format!("{at}: the table has no owner in ARCHITECTURE.md")),
            Some(owner) if owner != crate_name => problems.push(format!("{at}: owned by {owner}, written from {crate_name}")),
            Some(_) => {}
        }
    }
    problems
}

#[test]
fn a_write_outside_its_owner_is_named() {
    let owners = BTreeMap::from([("inbox".to_owned(), "herald-store".to_owned())]);
    let source = "fn f() {\n    sqlx::query(\"INSERT INTO inbox (a) VALUES ($1)\n        ON CONFLICT DO NOTHING\");\n    format!(\"DELETE FROM {t}\");\n    sqlx::query(\"UPDATE ledger SET x = 1\");\n}\n";
    let writes = scan::writes(source);
    assert_eq!(misplaced(&owners, "herald-store", "crates/herald-store/src/inbox.rs", &writes[..1]), Vec::<String>::new());
    assert_eq!(
        misplaced(&owners, "herald-consumer", "crates/herald-consumer/src/batch.rs", &writes),
        [
            "crates/herald-consumer/src/batch.rs:2: INSERT inbox: owned by herald-store, written from herald-consumer",
            "crates/herald-consumer/src/batch.rs:4: DELETE {t}: a table named at run time; only the lease primitive may",
            "crates/herald-consumer/src/batch.rs:5: UPDATE ledger: the table has no owner in ARCHITECTURE.md",
        ]
    );
}
