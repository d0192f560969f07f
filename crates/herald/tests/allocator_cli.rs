//! The `herald` binary's `malloc` is jemalloc's for every allocation in the
//! process, the C libraries' (librdkafka) included, with freed pages given
//! back after 1 s (`.cargo/config.toml`). jemalloc reads `MALLOC_CONF` only
//! when it is the process's unprefixed `malloc`; with the Rust-only
//! allocator it read `_RJEM_MALLOC_CONF` and librdkafka stayed on glibc's
//! (BENCHMARKS.md, "librdkafka's allocations too").

use std::process::Command;

#[test]
fn every_allocation_goes_to_jemalloc_with_its_built_in_decay() -> anyhow::Result<()> {
    let out = Command::new(env!("CARGO_BIN_EXE_herald")).arg("--version").env("MALLOC_CONF", "stats_print:true").output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("Begin jemalloc statistics"), "MALLOC_CONF must reach jemalloc as the process's malloc:\n{stderr}");
    assert!(stderr.contains("opt.dirty_decay_ms: 1000"), "freed pages go back after 1 s by default:\n{stderr}");
    Ok(())
}
