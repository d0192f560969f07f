//! A `HERALD_FAULT` that does not parse is bad input: the process says what
//! was wrong and exits 2 before starting any role, whichever role reads it.

use std::process::{Command, Output};

fn herald(args: &[&str], fault: &str) -> anyhow::Result<Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_herald")).args(args).env("HERALD_FAULT", fault).env("NO_COLOR", "1").output()?)
}

#[test]
fn a_bad_fault_spec_exits_2_naming_what_was_wrong() -> anyhow::Result<()> {
    let cases: [(&[&str], &str, &str); 3] = [
        (&["worker"], "crash:artifact-written", "unknown mode `crash`"),
        (&["dispatch"], "hang:after_provider_response", "unknown point `after_provider_response`"),
        (&["consume", "stats"], "pause-after-commit:0", "pause-after-commit:N with N ≥ 1"),
    ];
    for (args, fault, expected) in cases {
        let out = herald(args, fault)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} with {fault}: {stderr}");
        assert!(stderr.contains(&format!("HERALD_FAULT `{fault}`")) && stderr.contains(expected), "{args:?}: {stderr}");
    }
    Ok(())
}
