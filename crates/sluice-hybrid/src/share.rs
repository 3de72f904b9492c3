//! This instance's part among the live instances: its share of a key it has not synced yet,
//! whether it is alone, and how long its claims hold.

use std::sync::atomic::Ordering;
use std::time::Duration;

use sluice_core::Clock;

use crate::HybridStore;

impl<C: Clock + 'static> HybridStore<C> {
    /// This instance's share of a key it has not synced yet, whose limit leaves `remaining`
    /// units: all of them when it is alone; otherwise half of an even split, at least one unit
    /// while every instance can have one. Not reserved in Redis (the key has not been synced),
    /// so half: the other instances may be taking their own shares of the same key unseen.
    /// Once synced, a key's allowance is the grant its sync reserved instead.
    pub(crate) fn share(&self, remaining: u64) -> u64 {
        match self.inner.instances.load(Ordering::Relaxed) {
            0 | 1 => u64::MAX,
            n if remaining < n => 0,
            n => (remaining / (2 * n)).max(1),
        }
    }

    /// Whether this instance is the only one live: then the limit alone bounds it, and it
    /// decides exactly as the memory store would.
    pub(crate) fn alone(&self) -> bool {
        self.inner.instances.load(Ordering::Relaxed) <= 1
    }

    /// How long an instance counts as live after its last heartbeat, and a claim holds after the
    /// sync that made it.
    pub(crate) fn claim_ttl(&self) -> Duration {
        (self.inner.options.sync_interval * 20).max(Duration::from_millis(500))
    }
}
