//! The README's first command, as a user runs it: the `herald` binary's demo
//! on the embedded default, in its JSON form, and its usage errors.

use std::process::Command;

#[test]
fn demo_json_reports_every_check_passed() {
    let out = Command::new(env!("CARGO_BIN_EXE_herald")).args(["demo", "--exports", "30", "--json"]).output().expect("run herald demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "demo failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON object");
    assert_eq!(report["ok"], true);
    assert_eq!(report["jobs_succeeded"], 30);
    assert_eq!(report["completion_events"], 30);
    assert_eq!(report["search_documents"], 30);
    assert_eq!(report["duplicate_effects"], 0);
    assert_eq!(report["repeated_requests"], 3);
    assert_eq!(report["jobs_created"], 30, "repeated requests created no jobs");
    assert_eq!(report["notifications_sent"], 30);
    assert_eq!(report["provider_effects"], 30, "keyed provider: effects = intents, despite the lost ACK");
    assert_eq!(report["provider_requests"], 31, "the lost ACK was retried once");
    let checks = report["checks"].as_array().expect("checks");
    assert!(checks.len() >= 10);
    assert!(checks.iter().all(|c| c["ok"] == true && c["name"].is_string() && c["detail"].is_string()));
    let named = |prefix: &str| checks.iter().filter(|c| c["name"].as_str().is_some_and(|n| n.starts_with(prefix))).count();
    assert_eq!(named("rebuild verified and switched reads"), 1, "the scenario rebuilds search and switches");
    assert_eq!(named("replay sent no notification"), 1);
    assert_eq!(named("crashed worker's job taken over once"), 1);
    assert_eq!(named("audit "), 11, "the demo ends with every audit check");
    let audit = &report["audit"];
    assert_eq!(audit["violations"], 0, "{audit:#}");
    assert!(
        audit["checks"].as_array().is_some_and(|cs| cs.iter().all(|c| c["ran"] == true && c["checked"].as_u64() > Some(0))),
        "{audit:#}"
    );
}

#[test]
fn usage_errors_exit_with_status_2() {
    for args in [&["demo", "--exports", "zero"][..], &["demo", "--exports", "0"], &["no-such-command"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_herald")).args(args).output().expect("run herald");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(!out.stderr.is_empty(), "{args:?} explains itself");
    }
}

/// Every subcommand's arguments parse together: clap checks for clashing
/// names (two flattened argument groups both defining `--topic-prefix`, say)
/// only when a command is built, so build each one.
#[test]
fn every_subcommand_builds_its_arguments() {
    let out = Command::new(env!("CARGO_BIN_EXE_herald")).arg("--help").output().expect("run herald --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() >= 10, "{commands:?}");
    for command in commands {
        let out = Command::new(env!("CARGO_BIN_EXE_herald")).args([command, "--help"]).output().expect("run help");
        assert!(out.status.success(), "`herald {command} --help` failed: {}", String::from_utf8_lossy(&out.stderr));
    }
}
