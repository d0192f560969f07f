//! A relay that holds a quarter of the slices reads four times the rows per
//! batch (`RelayConfig::batch_for`), so its produce requests stay as large
//! as one relay's alone. Another owner holds the other twelve slices under a
//! long lease; every slice gets the same backlog; the relay must drain its
//! four slices' rows in one batch each.

mod relay_support;

use std::collections::BTreeMap;

use herald_relay::RelayConfig;
use herald_relay::claims::{self, SLICES};
use herald_store::outbox;
use relay_support::{bench, config, stat, wait_until};

const BATCH: i64 = 10;
const ROWS_PER_SLICE: usize = 40;

/// Keys giving every slice `ROWS_PER_SLICE` rows.
fn keys_filling_every_slice() -> Vec<String> {
    let mut per_slice: BTreeMap<i32, usize> = BTreeMap::new();
    let mut keys = Vec::new();
    for key in (0..).map(|n| format!("key-{n}")) {
        if per_slice.len() == SLICES as usize && per_slice.values().all(|&c| c == ROWS_PER_SLICE) {
            break;
        }
        let count = per_slice.entry(outbox::slice_of(&key)).or_default();
        if *count < ROWS_PER_SLICE {
            *count += 1;
            keys.push(key);
        }
    }
    keys
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_holding_four_slices_reads_four_batches_worth_at_once_postgres() -> anyhow::Result<()> {
    let b = bench(true).await?;
    let other = claims::claim(&b.db, "other-relay", 600_000, 12).await?;
    assert_eq!(other.len(), 12, "the other owner holds twelve slices");
    let keys = keys_filling_every_slice();
    b.append(&keys.iter().map(String::as_str).collect::<Vec<_>>()).await?;

    let relay = b.start(RelayConfig { batch_size: BATCH, ..config("quarter") })?;
    let mine = 4 * ROWS_PER_SLICE as u64;
    wait_until("the relay's four slices delivered", || async { Ok(stat(&relay.stats.delivered) >= mine) }).await?;
    let stats = relay.stats.clone();
    relay.stop().await?;

    assert_eq!(stat(&stats.delivered), mine, "only its own slices");
    // Holding 4 of 16 slices, a batch is 4 × BATCH = 40 rows: one per slice.
    // At BATCH rows a batch it would have taken sixteen.
    assert_eq!(stat(&stats.batches), 4, "one batch per slice");
    assert_eq!(stat(&stats.backlog_batches), 4, "each a full batch: the backlog's producer");
    Ok(())
}
