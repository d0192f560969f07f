//! `herald schemas check` as CI runs it: the project's own schemas pass, the
//! breaking fixture fails naming each broken field, bad input exits 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

fn check(dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["schemas", "check", "--dir"])
        .arg(dir)
        .env("HERALD_LOG", "warn")
        .output()
        .expect("run herald")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn project_schemas_pass_under_their_modes() {
    let out = check(&repo("schemas"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("export.completed: v1, v2 (full-transitive)"), "{stdout}");
    for subject in ["export.requested", "export.failed", "export.deleted"] {
        assert!(stdout.contains(&format!("{subject}: v1 (backward-transitive)")), "{stdout}");
    }
}

#[test]
fn breaking_fixture_fails_naming_the_removed_and_the_narrowed_field() {
    let out = check(&repo("tests/fixtures/schemas-breaking"));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let violations: Vec<&str> = all.lines().filter(|l| l.starts_with("violation: ")).collect();
    assert_eq!(violations.len(), 2, "{all}");
    assert!(all.contains("v1 readers cannot read v2 data: v2 removes field `sha256`, which has no default in v1"), "{all}");
    assert!(all.contains("v2 readers cannot read v1 data: field `size_bytes` is \"long\" in v1 but \"int\" in v2"), "{all}");
}

#[test]
fn bad_input_exits_2() -> anyhow::Result<()> {
    let out = check(&repo("tests/fixtures/no-such-dir"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));

    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("compatibility.toml"), "")?;
    std::fs::write(dir.path().join("export.completed.v1.avsc"), "{\"type\": \"record\", \"name\": ")?;
    let out = check(dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("export.completed.v1.avsc does not parse"), "{}", text(&out));

    // Schemas without their compatibility file: probably the wrong directory.
    std::fs::remove_file(dir.path().join("compatibility.toml"))?;
    let out = check(dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));

    std::fs::write(dir.path().join("compatibility.toml"), "default = \"sideways\"")?;
    std::fs::copy(repo("schemas/export.completed.v1.avsc"), dir.path().join("export.completed.v1.avsc"))?;
    let out = check(dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("compatibility.toml"), "{}", text(&out));
    Ok(())
}
