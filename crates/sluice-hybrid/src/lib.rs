//! The hybrid store for Sluice: every decision is made in this process, from the last known
//! global count plus this instance's own unsynchronised usage, and a background sync pushes the
//! usage to Redis and brings back the global state, in one atomic Lua call per Cluster slot per
//! interval. A key known to be over its limit is answered locally until its reset, and costs
//! Redis nothing.
//!
//! `docs/hybrid-store.md` gives the design, the error bound and what happens on a partition.
//!
//! The parts: `check.rs` decides (the local check path), from each key's bookkeeping in
//! `entry.rs` and its algorithm state in `local.rs`, within this instance's share (`share.rs`);
//! `sync_loop.rs` sends every interval's units with the wire of [`sync`] (`sync.lua`, one call
//! per Cluster slot), and `apply.rs` lays the reply under the keys; a reset leaves the marker of
//! `reset.lua`; `options.rs` and `stats.rs` hold what a store URL sets and what metrics read.
//! `reservations.rs` holds reservations: decided here, recorded and claimed in Redis
//! (`record.lua`, `claim.lua`), their refunds carried by the sync.
//!
//! ```no_run
//! use sluice_core::{Check, Gcra, Policy, Rate, Store};
//! use sluice_hybrid::{HybridOptions, HybridStore};
//! use sluice_redis::{RedisOptions, RedisStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let redis = RedisStore::connect("redis://127.0.0.1:6379", RedisOptions::default()).await?;
//! let store = HybridStore::new(redis, HybridOptions::default());
//! let _sync = store.spawn_sync();
//! let policy = Policy::from(Gcra::new(Rate::per_second(10), 20)?);
//! let decisions = store.check(&[Check::new("api|user=alice", &policy, 1)]).await?;
//! assert!(decisions[0].allowed);
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod apply;
mod check;
mod entry;
mod local;
mod options;
mod reservations;
mod share;
mod stats;
pub mod sync;
mod sync_loop;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use sluice_core::{
    Check, Clock, Decision, Policy, Store, StoreResult, SystemClock, UnsupportedPolicy,
};
use sluice_redis::RedisStore;

use check::unheld;
use entry::Entry;
use local::decide;
pub use options::HybridOptions;
pub use stats::HybridStats;
pub use sync::hybrid_supports;

/// Local decisions over a global count kept in Redis. Cheap to clone.
#[derive(Clone)]
pub struct HybridStore<C: Clock = SystemClock> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    redis: RedisStore,
    clock: C,
    options: HybridOptions,
    keys: Mutex<HashMap<String, Entry>>,
    /// One sync at a time, so that a slow sync and the next never push the same units.
    syncing: tokio::sync::Mutex<()>,
    last_sync: AtomicU64,
    syncs: AtomicU64,
    sync_failures: AtomicU64,
    /// Whether the last sync that had keys failed: Redis is away until one succeeds.
    away: std::sync::atomic::AtomicBool,
    over_admitted: AtomicU64,
    dropped: AtomicU64,
    /// This instance's name in the registry of live instances.
    id: String,
    /// Live instances, as the last heartbeat counted them; 1 until then.
    instances: AtomicU64,
    /// When the last heartbeat was answered (ns on the store's clock; 0: never).
    last_beat: AtomicU64,
    /// Sync attempts so far, which number the units each first sends (see `sync.lua`).
    attempts: AtomicU64,
    /// Whether the last sync counted this instance alone: lone instances keep units unsent
    /// longer, and send them all once another instance is live.
    synced_alone: std::sync::atomic::AtomicBool,
}

impl<C: Clock> std::fmt::Debug for HybridStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridStore")
            .field("redis", &self.inner.redis)
            .field("options", &self.inner.options)
            .finish()
    }
}

impl HybridStore<SystemClock> {
    /// A hybrid store over `redis` on the system clock. Call [`HybridStore::spawn_sync`] to sync
    /// in the background.
    pub fn new(redis: RedisStore, options: HybridOptions) -> Self {
        Self::with_clock(redis, options, SystemClock::new())
    }
}

impl<C: Clock + 'static> HybridStore<C> {
    /// A hybrid store whose local decisions read `clock`: tests pass a `FakeClock` and call
    /// [`HybridStore::sync_now`] instead of waiting for the interval.
    pub fn with_clock(redis: RedisStore, options: HybridOptions, clock: C) -> Self {
        let now = clock.now().as_nanos();
        HybridStore {
            inner: Arc::new(Inner {
                redis,
                clock,
                options,
                keys: Mutex::new(HashMap::new()),
                syncing: tokio::sync::Mutex::new(()),
                last_sync: AtomicU64::new(now),
                syncs: AtomicU64::new(0),
                sync_failures: AtomicU64::new(0),
                away: std::sync::atomic::AtomicBool::new(false),
                over_admitted: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
                id: instance_id(),
                instances: AtomicU64::new(1),
                last_beat: AtomicU64::new(0),
                attempts: AtomicU64::new(0),
                synced_alone: std::sync::atomic::AtomicBool::new(true),
            }),
        }
    }

    /// The Redis store the counts are synced to.
    pub fn redis(&self) -> &RedisStore {
        &self.inner.redis
    }

    /// The options.
    pub fn options(&self) -> &HybridOptions {
        &self.inner.options
    }
}

/// A name for this store in the registry of live instances: its process, the wall-clock time
/// it started and its number within the process, which no two live stores share.
fn instance_id() -> String {
    static STORES: AtomicU64 = AtomicU64::new(0);
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = STORES.fetch_add(1, Ordering::Relaxed);
    format!("{}-{started}-{n}", std::process::id())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<C: Clock + 'static> Store for HybridStore<C> {
    async fn check(&self, checks: &[Check<'_>]) -> StoreResult<Vec<Decision>> {
        self.check_local(checks)
    }

    /// Every decision is local, so a single check never waits: no future, no box.
    fn check_now(&self, check: Check<'_>) -> Option<StoreResult<Decision>> {
        Some(self.check_one(&check))
    }

    /// Decided here like a check of the amount; the record goes to Redis, so that any instance
    /// can settle it (`reservations.rs`).
    async fn reserve(
        &self,
        checks: &[Check<'_>],
        lease: sluice_core::Lease<'_>,
    ) -> StoreResult<Vec<Decision>> {
        self.reserve_here(checks, lease).await
    }

    /// Claimed in Redis, once for all instances; what it gives back or charges goes to the
    /// others with the sync.
    async fn settle(
        &self,
        id: &sluice_core::ReservationId,
        used: u64,
    ) -> StoreResult<sluice_core::Settlement> {
        self.settle_here(id, used).await
    }

    async fn refund(&self, refunds: &[sluice_core::Refund<'_>]) -> StoreResult<Vec<Decision>> {
        self.refund_here(refunds)
    }

    /// Decides locally, like a check. A key this instance has not seen yet is registered, so
    /// that the next sync reads its global state; nothing is consumed.
    async fn peek(&self, key: &str, policy: &Policy) -> StoreResult<Decision> {
        let inner = &self.inner;
        let now = inner.clock.now();
        let mut keys = lock(&inner.keys);
        let stored = keys
            .get(key)
            .filter(|e| e.policy == *policy)
            .map(|e| e.state);
        let Some((fresh, d)) = decide(policy, stored.as_ref(), now, 0) else {
            return Err(unheld(policy));
        };
        self.watch(&mut keys, key, policy, fresh, now);
        Ok(d)
    }

    async fn reset(&self, key: &str) -> StoreResult<bool> {
        let removed = lock(&self.inner.keys).remove(key);
        // The marker outlasts what other instances may still know of the key: two of its spans.
        let span = removed.as_ref().map_or(std::time::Duration::ZERO, |e| {
            local::span(&e.policy).saturating_mul(2)
        });
        let global = sync::reset_hybrid(&self.inner.redis, key, span).await?;
        Ok(removed.is_some() || global)
    }

    /// Units a rule's `on_store_error` admitted while this store reported Redis away are this
    /// instance's to push like its own: they stay pending until a sync reaches Redis, and count
    /// against the limit from then on (within the two windows pending units are kept for).
    /// The overrides are the Redis store's: every instance on that Redis shares them.
    fn shares_overrides(&self) -> bool {
        self.redis().shares_overrides()
    }

    async fn put_override(&self, id: &str, body: &str) -> StoreResult<u64> {
        self.redis().put_override(id, body).await
    }

    async fn remove_override(&self, id: &str) -> StoreResult<u64> {
        self.redis().remove_override(id).await
    }

    async fn override_version(&self) -> StoreResult<u64> {
        self.redis().override_version().await
    }

    async fn overrides(&self) -> StoreResult<sluice_core::SharedOverrides> {
        Store::overrides(self.redis()).await
    }

    fn admitted_without_store(&self, checks: &[Check<'_>]) {
        let inner = &self.inner;
        let now = inner.clock.now();
        let mut keys = lock(&inner.keys);
        for c in checks.iter().filter(|c| c.cost > 0) {
            if hybrid_supports(c.policy).is_err() {
                continue;
            }
            if !keys.contains_key(c.key) {
                if keys.len() >= inner.options.max_keys {
                    continue;
                }
                let Some((fresh, _)) = decide(c.policy, None, now, 0) else {
                    continue;
                };
                let share = self.share(c.policy.limit());
                keys.insert(c.key.to_owned(), Entry::new(c.policy, fresh, now, share));
            }
            if let Some(e) = keys.get_mut(c.key).filter(|e| e.policy == *c.policy) {
                e.admit_anyway(c.cost, now, &inner.dropped);
            }
        }
    }

    fn tracked_keys(&self) -> Option<usize> {
        Some(lock(&self.inner.keys).len())
    }

    fn supports(&self, policy: &Policy) -> Result<(), UnsupportedPolicy> {
        hybrid_supports(policy)
    }
}
