//! Replay cannot notify, by structure: the notification crate is not in
//! herald-rebuild's dependency graph. Only workspace crates can depend on
//! `herald-notify`, so the walk covers the workspace's own manifests
//! (`cargo metadata --no-deps`, no network). It is checked against a crate
//! that does depend on it, so a broken walk cannot pass silently.

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

use serde_json::Value;

/// Workspace crates `root` depends on (normal dependencies), transitively.
fn closure(members: &HashMap<String, Vec<String>>, root: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![root.to_owned()];
    while let Some(name) = todo.pop() {
        for dep in members.get(&name).into_iter().flatten() {
            if members.contains_key(dep) && seen.insert(dep.clone()) {
                todo.push(dep.clone());
            }
        }
    }
    seen
}

fn workspace() -> HashMap<String, Vec<String>> {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let metadata: Value = serde_json::from_slice(&out.stdout).expect("metadata json");
    metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().expect("name").to_owned())
                .collect();
            (p["name"].as_str().expect("name").to_owned(), deps)
        })
        .collect()
}

#[test]
fn herald_rebuild_does_not_depend_on_notification_code() {
    let members = workspace();
    let rebuild = closure(&members, "herald-rebuild");
    assert!(rebuild.contains("herald-projections") && rebuild.contains("herald-store"), "the walk finds real dependencies: {rebuild:?}");
    assert!(!rebuild.contains("herald-notify"), "herald-rebuild must not reach notification code: {rebuild:?}");
    assert!(closure(&members, "herald").contains("herald-notify"), "the walk would see it if it were there");
}

/// The projection engine (live and replay) and the read models it runs are
/// what a rebuild executes: none of them may reach notification code either.
#[test]
fn the_projection_engine_does_not_depend_on_notification_code() {
    let members = workspace();
    for engine in ["herald-consumer", "herald-projections", "herald-store"] {
        let reach = closure(&members, engine);
        assert!(!reach.contains("herald-notify"), "{engine} must not reach notification code: {reach:?}");
    }
    assert!(closure(&members, "herald-rebuild").contains("herald-consumer"), "the rebuild runs on the engine");
}

/// The product never depends on its proof: demo, drill, benchmarks and the
/// provider simulator (herald-proof) are reached from the binary alone, so
/// no role's code can call into them (herald-wiring, which the demo starts,
/// included).
#[test]
fn no_product_crate_depends_on_the_proof() {
    let members = workspace();
    for name in members.keys().filter(|name| !["herald", "herald-proof"].contains(&name.as_str())) {
        let reach = closure(&members, name);
        assert!(!reach.contains("herald-proof"), "{name} must not reach herald-proof: {reach:?}");
    }
    assert!(members.contains_key("herald-wiring") && members.contains_key("herald-notify"), "the walk sees the product crates");
    assert!(closure(&members, "herald").contains("herald-proof"), "the walk would see it if it were there");
}
