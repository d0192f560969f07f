//! Every Kafka client of a Herald role is built from `KafkaConfig`, so a
//! connection setting (TLS, SASL, client id) added there reaches all of them.
//! This fails when production code outside herald-kafka starts a client from
//! a bare `rdkafka::ClientConfig`.

use std::path::{Path, PathBuf};

/// Crates that are infrastructure for tests and drills, never a role's
/// dependency: they start and observe brokers on loopback.
const INFRASTRUCTURE: &[&str] = &["herald-cluster", "herald-testkit"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable source tree").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `file:line` of each bare client configuration in `text`.
fn bare_clients(file: &str, text: &str) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .filter(|(_, line)| line.contains("ClientConfig::new()") || line.contains("ClientConfig::default()"))
        .map(|(i, _)| format!("{file}:{}", i + 1))
        .collect()
}

#[test]
fn production_code_builds_kafka_clients_only_through_kafka_config() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&crates).expect("crates directory").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "herald-kafka" || INFRASTRUCTURE.contains(&name.as_str()) {
            continue;
        }
        let src = entry.path().join("src");
        if !src.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).expect("readable source file");
            found.extend(bare_clients(&file.display().to_string(), &text));
        }
    }
    assert!(found.is_empty(), "Kafka clients built outside herald_kafka::KafkaConfig:\n{}", found.join("\n"));
}

#[test]
fn the_scan_finds_a_bare_client_and_passes_over_comments() {
    let text = "// ClientConfig::new() in a comment\nlet c: BaseConsumer = ClientConfig::new().set(\"bootstrap.servers\", b).create()?;\n";
    assert_eq!(bare_clients("x.rs", text), vec!["x.rs:2".to_owned()]);
}
