//! Schemas at run time through the binary: `herald serve --schemas DIR`
//! (embedded default) reads a schema deployed after the build and serves
//! every schema it knows at `GET /schemas/{file}` — the deployed one too,
//! as written — and an unknown file as problem+json 404; a directory whose
//! schemas break compatibility, or that changes a released file, stops the
//! command with exit 2 before it serves anything. (That a consumer decodes
//! records written with a deployed schema is tests/tests/schema_evolution.rs,
//! through the same `Registry::with_dir`.)

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

const V3_FILE: &str = "export.completed.v3.avsc";

/// v2 of `export.completed` plus a field with a default: compatible both ways.
fn v3_text() -> String {
    let v2 = herald_envelope::schema::FILES.iter().find(|(f, _)| *f == "export.completed.v2.avsc").expect("v2").1;
    let mut json: serde_json::Value = serde_json::from_str(v2).expect("v2 json");
    json["fields"].as_array_mut().expect("fields").push(serde_json::json!({"name": "row_count", "type": "long", "default": 0}));
    json.to_string()
}

struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &Path) -> anyhow::Result<(Serving, String)> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["serve", "--listen", "127.0.0.1:0", "--schemas"])
        .arg(dir)
        .env_remove("HERALD_DATABASE_URL")
        .env_remove("HERALD_KAFKA_BROKERS")
        .env("HERALD_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().expect("piped");
    let serving = Serving(child);
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        if let Some(url) = line?.strip_prefix("herald listening on ") {
            // Keep reading: a closed pipe would fail the server's next print.
            std::thread::spawn(move || lines.for_each(drop));
            return Ok((serving, url.to_owned()));
        }
    }
    anyhow::bail!("herald serve ended without listening")
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_reads_a_deployed_schema_and_serves_every_schema_it_knows() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join(V3_FILE), v3_text())?;
    let (_serving, base) = serve(dir.path())?;

    let listed: Vec<String> = reqwest::get(format!("{base}/schemas")).await?.json().await?;
    for file in ["export.completed.v1.avsc", "export.completed.v2.avsc", V3_FILE, "export.requested.v1.avsc"] {
        assert!(listed.iter().any(|f| f == file), "{file} in {listed:?}");
    }
    let deployed = reqwest::get(format!("{base}/schemas/{V3_FILE}")).await?;
    assert_eq!(deployed.status(), 200);
    assert_eq!(deployed.headers()["content-type"], "application/json");
    assert_eq!(deployed.text().await?, v3_text());
    let embedded = reqwest::get(format!("{base}/schemas/export.completed.v2.avsc")).await?.text().await?;
    assert_eq!(embedded, herald_envelope::schema::FILES.iter().find(|(f, _)| *f == "export.completed.v2.avsc").expect("v2").1);
    let missing = reqwest::get(format!("{base}/schemas/export.completed.v9.avsc")).await?;
    assert_eq!(missing.status(), 404);
    assert_eq!(missing.headers()["content-type"], "application/problem+json");
    Ok(())
}

#[test]
fn a_directory_that_breaks_compatibility_or_a_released_file_exits_2() -> anyhow::Result<()> {
    let breaking = tempfile::tempdir()?;
    // v3 makes `size_bytes` a string: v2 data no longer reads, nor the other way.
    let v2 = herald_envelope::schema::FILES.iter().find(|(f, _)| *f == "export.completed.v2.avsc").expect("v2").1;
    let mut json: serde_json::Value = serde_json::from_str(v2)?;
    for field in json["fields"].as_array_mut().expect("fields") {
        if field["name"] == "size_bytes" {
            field["type"] = "string".into();
        }
    }
    std::fs::write(breaking.path().join(V3_FILE), json.to_string())?;
    let changed = tempfile::tempdir()?;
    std::fs::write(changed.path().join("export.completed.v1.avsc"), v3_text())?;

    for (dir, expect) in [(breaking.path(), "incompatible"), (changed.path(), "released files never change")] {
        let out = Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(["serve", "--listen", "127.0.0.1:0", "--schemas"])
            .arg(dir)
            .env_remove("HERALD_DATABASE_URL")
            .env_remove("HERALD_KAFKA_BROKERS")
            .env("HERALD_LOG", "warn")
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("--schemas") && stderr.contains(expect), "{stderr}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("listening"), "refused before serving");
    }
    Ok(())
}
