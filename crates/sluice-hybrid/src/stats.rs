//! Health and accuracy figures of a hybrid store, for its metrics: sync lag, units and keys not
//! yet synced, the negative cache, the over-admission the syncs found.

use std::sync::atomic::Ordering;
use std::time::Duration;

use sluice_core::{Clock, Timestamp};
use sluice_redis::RedisStats;

use crate::entry::Entry;
use crate::{HybridStore, lock};

/// Health and accuracy figures of a hybrid store, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HybridStats {
    /// Time since the last successful sync: how stale the global counts may be.
    pub sync_lag: Duration,
    /// Units admitted here and not yet in Redis.
    pub pending_units: u64,
    /// Keys with units not yet in Redis.
    pub pending_keys: usize,
    /// Keys in the negative cache: answered locally, and not read from Redis, until their reset.
    pub negative_cached: usize,
    /// Keys tracked locally.
    pub keys: usize,
    /// Units over the limit that the last syncs found admitted in all (summed over keys at each
    /// sync): the estimate of over-admission.
    pub over_admitted: u64,
    /// Successful syncs.
    pub syncs: u64,
    /// Failed syncs (Redis away or slow): their units were kept for the next.
    pub sync_failures: u64,
    /// Units dropped unsynchronised: a window that ended before Redis was reached.
    pub dropped_units: u64,
    /// Live instances on this Redis and prefix, as the last heartbeat counted them.
    pub instances: u64,
    /// The Redis store's own figures: breaker state and the like.
    pub redis: RedisStats,
}

impl<C: Clock + 'static> HybridStore<C> {
    /// Figures for metrics.
    pub fn stats(&self) -> HybridStats {
        let inner = &self.inner;
        let keys = lock(&inner.keys);
        let now = inner.clock.now();
        let pending_keys = keys
            .values()
            .filter(|e| !e.pending.is_empty() || !e.doubt.is_empty())
            .count();
        HybridStats {
            sync_lag: now.saturating_since(Timestamp::from_nanos(
                inner.last_sync.load(Ordering::Relaxed),
            )),
            pending_units: keys.values().map(Entry::pending_units).sum(),
            pending_keys,
            negative_cached: keys.values().filter(|e| e.quiet_until > now).count(),
            keys: keys.len(),
            over_admitted: inner.over_admitted.load(Ordering::Relaxed),
            syncs: inner.syncs.load(Ordering::Relaxed),
            sync_failures: inner.sync_failures.load(Ordering::Relaxed),
            dropped_units: inner.dropped.load(Ordering::Relaxed),
            instances: inner.instances.load(Ordering::Relaxed),
            redis: inner.redis.stats(),
        }
    }
}
