//! In-process news of committed outbox rows, for the relay of the same
//! process. PostgreSQL wakes relays with the outbox trigger's `NOTIFY`;
//! SQLite has nothing of the kind, so without this news a relay in `herald
//! serve` would find an intake's command only at its next poll (up to
//! `idle_max` later). Writers in other processes still reach it only by
//! that poll.

use std::sync::atomic::{AtomicU32, Ordering};

use tokio::sync::watch;

use crate::outbox::{SLICES, slice_of};

const _: () = assert!(SLICES <= 32, "the pending slices are one bit each in a u32");

/// Slices with rows committed since the relay last looked, and a channel
/// that changes whenever one is added. Shared by every clone of a [`crate::Db`].
#[derive(Debug)]
pub struct Appended {
    pending: AtomicU32,
    news: watch::Sender<u64>,
}

impl Default for Appended {
    fn default() -> Self {
        Appended { pending: AtomicU32::new(0), news: watch::channel(0).0 }
    }
}

impl Appended {
    /// Announces rows of `partition_keys` as committed. Call it after the
    /// commit: a relay woken before would read nothing and wait again.
    pub fn announce<'a>(&self, partition_keys: impl IntoIterator<Item = &'a str>) {
        let slices = partition_keys.into_iter().fold(0u32, |bits, key| bits | 1 << slice_of(key));
        if slices != 0 {
            self.pending.fetch_or(slices, Ordering::AcqRel);
            self.news.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// A receiver that changes after each announcement.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.news.subscribe()
    }

    /// The slices announced since the last call, cleared.
    pub fn take(&self) -> Vec<i32> {
        let bits = self.pending.swap(0, Ordering::AcqRel);
        (0..SLICES).filter(|slice| bits & (1 << slice) != 0).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announced_slices_are_taken_once() {
        let appended = Appended::default();
        let mut news = appended.subscribe();
        appended.announce(["job-1", "job-2", "job-1"]);
        assert!(news.has_changed().unwrap());
        let mut want = vec![slice_of("job-1"), slice_of("job-2")];
        want.sort();
        want.dedup();
        assert_eq!(appended.take(), want);
        assert_eq!(appended.take(), Vec::<i32>::new());
        news.borrow_and_update();
        appended.announce([]);
        assert!(!news.has_changed().unwrap(), "nothing announced, nobody woken");
    }
}
