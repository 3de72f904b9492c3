//! The hybrid store for Sluice: every decision is made in this process, from the last known
//! global count plus this instance's own unsynchronised usage, and a background sync pushes the
//! usage to Redis and brings back the global state, in one atomic Lua call per Cluster slot per
//! interval. A key known to be over its limit is answered locally until its reset, and costs
//! Redis nothing.
//!
//! `docs/hybrid-store.md` gives the design, the error bound and what happens on a partition.
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

mod local;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use local::{Local, add_units, decide, from_global, over_limit, window_end};
use sluice_core::{
    Check, Clock, Decision, Policy, Store, StoreError, StoreResult, SystemClock, Timestamp,
    UnsupportedPolicy,
};
use sluice_redis::{Claimant, RedisStats, RedisStore, SyncEntry, Synced, hybrid_supports};

/// How a hybrid store syncs, and how much it keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HybridOptions {
    /// Time between two syncs. The error bound grows with it (see `docs/hybrid-store.md`).
    pub sync_interval: Duration,
    /// The most keys in one script call; a slot with more keys takes several calls, sent
    /// together.
    pub batch: usize,
    /// The most keys tracked locally. Each key's unsynchronised units live in its entry, so this
    /// also bounds what is kept while Redis is away.
    pub max_keys: usize,
}

impl Default for HybridOptions {
    fn default() -> Self {
        HybridOptions {
            sync_interval: Duration::from_millis(20),
            batch: 512,
            max_keys: 100_000,
        }
    }
}

/// One key's entry: its local state, and what it owes the global count.
#[derive(Debug)]
struct Entry {
    policy: Policy,
    state: Local,
    /// Units admitted here and not yet in Redis, by the end of the window they were counted in
    /// (for the bucket algorithms: one batch, by the time of its latest unit). At most two windows: the current one and, for the
    /// sliding counter, the one before.
    pending: Vec<(Timestamp, u64)>,
    /// The negative cache: until then, the key is known to refuse even one unit, and the sync
    /// leaves it alone unless it has units to push.
    quiet_until: Timestamp,
    /// When the counter is full again: after that, and with nothing pending, the entry can go.
    expires: Timestamp,
    /// Units this instance may still admit before the next sync: what its last sync was granted
    /// and reserved in Redis for it (or, for a key it has not synced yet, its share of the
    /// limit).
    allowance: u64,
    /// Until when the allowance may be used: its claim in Redis expires unless a sync renews it.
    allowance_until: Timestamp,
    /// Units asked of this key here since the last sync, admitted or not: what the instance
    /// keeps of its allowance while a sync is on its way.
    wanted: u64,
    /// When a sync must read the key, even if it was asked for nothing, to renew its claim
    /// before the allowance lapses.
    renew_at: Timestamp,
}

impl Entry {
    fn add_pending(&mut self, end: Timestamp, units: u64, dropped: &AtomicU64) {
        if is_bucket(&self.policy) {
            // One batch per key, dated by its latest unit: the sync counts the batch as admitted
            // then, so that refill since is not taken from it.
            match self.pending.first_mut() {
                Some((e, u)) => {
                    *e = (*e).max(end);
                    *u = u.saturating_add(units);
                }
                None => self.pending.push((end, units)),
            }
            return;
        }
        match self.pending.iter_mut().find(|(e, _)| *e == end) {
            Some((_, u)) => *u = u.saturating_add(units),
            None => {
                self.pending.push((end, units));
                self.pending.sort_by_key(|(e, _)| *e);
                if self.pending.len() > 2 {
                    let (_, old) = self.pending.remove(0);
                    dropped.fetch_add(old, Ordering::Relaxed);
                }
            }
        }
    }

    /// Keeps `state`, which admitted `cost` units with decision `d` at `now`: the units are
    /// taken from the allowance and owed to the global count.
    fn commit(
        &mut self,
        policy: &Policy,
        state: Local,
        cost: u64,
        d: Decision,
        now: Timestamp,
        dropped: &AtomicU64,
    ) {
        let end = if is_bucket(policy) {
            now
        } else {
            window_end(policy, &state)
        };
        self.state = state;
        self.allowance = self.allowance.saturating_sub(cost);
        self.add_pending(end, cost, dropped);
        self.expires = self.expires.max(now.saturating_add(d.reset_after));
    }

    /// Whether the entry can go: nothing left to push, and its counter full again.
    fn spent(&self, now: Timestamp) -> bool {
        self.pending.is_empty() && self.expires <= now
    }

    fn pending_units(&self) -> u64 {
        self.pending.iter().map(|(_, u)| u).sum()
    }

    /// What may still be admitted here at `now` before the next sync.
    fn allowance_at(&self, now: Timestamp) -> u64 {
        if now < self.allowance_until {
            self.allowance
        } else {
            0
        }
    }

    /// A new entry, with the share of a key not synced yet.
    fn new(policy: &Policy, state: Local, expires: Timestamp, share: u64) -> Entry {
        Entry {
            policy: policy.clone(),
            state,
            pending: Vec::new(),
            quiet_until: Timestamp::EPOCH,
            expires,
            allowance: share,
            allowance_until: Timestamp::from_nanos(u64::MAX),
            wanted: 0,
            renew_at: Timestamp::EPOCH,
        }
    }
}

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

    /// Syncs every [`HybridOptions::sync_interval`] on the current Tokio runtime, until the
    /// store is dropped (the task holds only a weak reference) or the handle is aborted.
    pub fn spawn_sync(&self) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner<C>> = Arc::downgrade(&self.inner);
        let interval = self.inner.options.sync_interval;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let _ = (HybridStore { inner }).sync_now().await;
            }
        })
    }

    /// Figures for metrics.
    pub fn stats(&self) -> HybridStats {
        let inner = &self.inner;
        let keys = lock(&inner.keys);
        let now = inner.clock.now();
        let pending_keys = keys.values().filter(|e| !e.pending.is_empty()).count();
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

    /// Pushes every key's unsynchronised units to Redis and brings back every tracked key's
    /// global state, except keys in the negative cache with nothing to push. On failure the units
    /// stay pending for the next sync and local decisions go on.
    pub async fn sync_now(&self) -> StoreResult<()> {
        let inner = &self.inner;
        let _one = inner.syncing.lock().await;
        let now = inner.clock.now();
        let ttl = self.claim_ttl();
        let mut entries: Vec<SyncEntry> = Vec::new();
        {
            let mut keys = lock(&inner.keys);
            // One pass: entries with nothing to push whose counter is full again go, the others
            // are listed.
            keys.retain(|key, e| {
                if e.spent(now) {
                    return false;
                }
                // A key with nothing to push is read if it was asked for since the last sync,
                // and otherwise only every quarter of a claim's time to live, to renew its
                // claim: a key that sees a request now and then costs Redis a few reads a
                // second, not one every interval. A key in the negative cache is not read.
                let idle = e.wanted == 0 && now < e.renew_at;
                if e.pending.is_empty() && (e.quiet_until > now || idle) {
                    return true;
                }
                e.renew_at = now.saturating_add(ttl / 4);
                // Of its allowance, the instance keeps twice what this key was asked for since
                // the last sync, for the requests it admits while this one is on its way (which
                // may take longer than the last); the rest is given back. It asks for as much
                // again until the next sync.
                let want = e.wanted.saturating_mul(2);
                let keep = e.allowance_at(now).min(want);
                e.allowance = keep;
                e.wanted = 0;
                let share = self.share(e.policy.limit()).min(e.policy.limit());
                if e.pending.is_empty() {
                    entries.push(SyncEntry {
                        key: key.clone(),
                        policy: e.policy.clone(),
                        units: 0,
                        to_end_nanos: 0,
                        keep,
                        want,
                        share,
                    });
                    return true;
                }
                for (end, units) in e.pending.drain(..) {
                    let to_end = i128::from(end.as_nanos()) - i128::from(now.as_nanos());
                    entries.push(SyncEntry {
                        key: key.clone(),
                        policy: e.policy.clone(),
                        units,
                        to_end_nanos: i64::try_from(to_end).unwrap_or(i64::MIN),
                        keep,
                        want,
                        share,
                    });
                }
                true
            });
        }
        // The heartbeat goes with every sync that has keys to push or read, and on its own when
        // half its time to live has passed: an idle instance stays counted, at one call per
        // quarter of a second, and every key idle or negative-cached costs nothing.
        let beat_due = now
            .as_nanos()
            .saturating_sub(inner.last_beat.load(Ordering::Relaxed))
            >= u64::try_from((ttl / 2).as_nanos()).unwrap_or(u64::MAX);
        if entries.is_empty() && !beat_due {
            inner.last_sync.store(now.as_nanos(), Ordering::Relaxed);
            return Ok(());
        }
        let claimant = Claimant {
            id: &inner.id,
            ttl,
            instances: inner.instances.load(Ordering::Relaxed),
        };
        let claimed_alone = claimant.instances <= 1;
        let (beat, synced) = tokio::join!(
            inner.redis.heartbeat(&inner.id, ttl),
            inner
                .redis
                .sync_batch(&entries, inner.options.batch, claimant)
        );
        if let Ok(n) = beat {
            inner.instances.store(n, Ordering::Relaxed);
            inner.last_beat.store(now.as_nanos(), Ordering::Relaxed);
        }
        if entries.is_empty() {
            inner.last_sync.store(now.as_nanos(), Ordering::Relaxed);
            return beat.map(|_| ());
        }
        match synced {
            Ok(states) => {
                // A grant may be used until its claim could expire: half the claim's time to
                // live after the sync left, which leaves room for clocks and latency.
                let grants = Grants {
                    until: now.saturating_add(ttl / 2),
                    claimed_alone,
                };
                self.apply(&entries, &states, grants).await;
                inner.syncs.fetch_add(1, Ordering::Relaxed);
                inner.away.store(false, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                inner.sync_failures.fetch_add(1, Ordering::Relaxed);
                inner.away.store(true, Ordering::Relaxed);
                let mut keys = lock(&inner.keys);
                let now = inner.clock.now();
                for s in entries.into_iter().filter(|s| s.units > 0) {
                    let Some(entry) = keys.get_mut(&s.key) else {
                        continue;
                    };
                    let at = i128::from(now.as_nanos()) + i128::from(s.to_end_nanos);
                    let end = Timestamp::from_nanos(u64::try_from(at.max(1)).unwrap_or(u64::MAX));
                    entry.add_pending(end, s.units, &inner.dropped);
                }
                Err(e)
            }
        }
    }

    /// Lays the global states a sync returned under each key's units admitted since.
    async fn apply(&self, entries: &[SyncEntry], states: &[Synced], grants: Grants) {
        let inner = &self.inner;
        let now = inner.clock.now();
        let mut over = 0u64;
        // A key pushed in two windows appears twice, one entry after the other (see
        // `sync_now`); its last reply is the latest state.
        let last: Vec<(&str, usize)> = entries
            .iter()
            .enumerate()
            .filter(|&(i, s)| entries.get(i + 1).is_none_or(|next| next.key != s.key))
            .map(|(i, s)| (s.key.as_str(), i))
            .collect();
        // The keys are updated a chunk at a time, each under the lock on its own, and the task
        // yields between chunks, so that requests served on the same thread are not held up
        // behind a sync of many keys; every key's update reads its entry as it is then, so none
        // depends on the others.
        for (n, chunk) in last.chunks(APPLY_CHUNK).enumerate() {
            if n > 0 {
                tokio::task::yield_now().await;
            }
            let mut keys = lock(&inner.keys);
            for &(key, i) in chunk {
                over = over.saturating_add(self.apply_one(
                    &mut keys,
                    key,
                    &entries[i],
                    states[i],
                    now,
                    grants,
                ));
            }
        }
        inner.over_admitted.fetch_add(over, Ordering::Relaxed);
        inner.last_sync.store(now.as_nanos(), Ordering::Relaxed);
    }

    /// Lays one key's global state under its units admitted since; the units the state shows
    /// beyond the limit.
    fn apply_one(
        &self,
        keys: &mut HashMap<String, Entry>,
        key: &str,
        sent: &SyncEntry,
        synced: Synced,
        now: Timestamp,
        grants: Grants,
    ) -> u64 {
        let global = synced.state;
        let over = over_limit(&sent.policy, global);
        let Some(entry) = keys.get_mut(key) else {
            return over; // reset while the sync was on its way
        };
        if entry.policy != sent.policy {
            return over;
        }
        let Some(mut state) = from_global(&entry.policy, global, Some(&entry.state), now) else {
            return over;
        };
        for &(end, units) in &entry.pending {
            add_units(&entry.policy, &mut state, end, units, now);
        }
        entry.state = state;
        if let Some((_, d)) = decide(&entry.policy, Some(&state), now, 1) {
            entry.quiet_until = if d.allowed || d.retry_after == Decision::NEVER {
                Timestamp::EPOCH
            } else {
                now.saturating_add(d.retry_after)
            };
        }
        if let Some((_, d)) = decide(&entry.policy, Some(&state), now, 0) {
            entry.expires = entry.expires.max(now.saturating_add(d.reset_after));
            // What is left of what the instance kept, and the grant reserved for it; a lone
            // instance is bounded by the limit alone, and a key with no live window to claim in
            // starts afresh. A sync made as a lone instance reserved only what was kept: if
            // others have joined since, that is all the instance may use, until the next sync
            // (at once) claims its part among them.
            entry.allowance = match synced.grant {
                _ if self.alone() => u64::MAX,
                _ if grants.claimed_alone => {
                    entry.renew_at = Timestamp::EPOCH;
                    entry.allowance
                }
                Some(grant) => entry.allowance.saturating_add(grant),
                None => self.share(entry.policy.limit()),
            };
            entry.allowance_until = grants.until;
        }
        over
    }

    /// This instance's share of a key it has not synced yet, whose limit leaves `remaining`
    /// units: all of them when it is alone; otherwise half of an even split, at least one unit
    /// while every instance can have one. Not reserved in Redis (the key has not been synced),
    /// so half: the other instances may be taking their own shares of the same key unseen.
    /// Once synced, a key's allowance is the grant its sync reserved instead.
    fn share(&self, remaining: u64) -> u64 {
        match self.inner.instances.load(Ordering::Relaxed) {
            0 | 1 => u64::MAX,
            n if remaining < n => 0,
            n => (remaining / (2 * n)).max(1),
        }
    }

    /// Whether this instance is the only one live: then the limit alone bounds it, and it
    /// decides exactly as the memory store would.
    fn alone(&self) -> bool {
        self.inner.instances.load(Ordering::Relaxed) <= 1
    }

    /// How long an instance counts as live after its last heartbeat, and a claim holds after the
    /// sync that made it.
    fn claim_ttl(&self) -> Duration {
        (self.inner.options.sync_interval * 20).max(Duration::from_millis(500))
    }

    /// Decides every check locally, all or nothing.
    fn check_local(&self, checks: &[Check<'_>]) -> StoreResult<Vec<Decision>> {
        if let [one] = checks {
            return self.check_one(one).map(|d| vec![d]);
        }
        let now = self.inner.clock.now();
        let mut keys = lock(&self.inner.keys);
        self.check_with(&mut keys, checks, now)
    }

    /// Decides one check as [`Self::check_with`] would, with one lookup of the key (two for a
    /// key this instance does not track yet).
    fn check_one(&self, c: &Check<'_>) -> StoreResult<Decision> {
        let inner = &self.inner;
        let now = inner.clock.now();
        let mut keys = lock(&inner.keys);
        let e = match keys.get_mut(c.key) {
            Some(e) if e.policy == *c.policy => e,
            Some(_) => {
                // The key's policy changed with the rules: the general path starts it afresh.
                let mut d = self.check_with(&mut keys, std::slice::from_ref(c), now)?;
                return d.pop().ok_or_else(|| unheld(c.policy));
            }
            None => {
                if c.cost > 0 {
                    self.make_room(&mut keys, 1, now)?;
                }
                let Some((state, d)) = decide(c.policy, None, now, c.cost) else {
                    return Err(unheld(c.policy));
                };
                let share = self.share(c.policy.limit());
                let d = self.within_share(d, c.cost, share, now)?;
                if d.allowed && c.cost > 0 {
                    let mut fresh = Entry::new(c.policy, state, now, share);
                    fresh.wanted = c.cost;
                    fresh.commit(c.policy, state, c.cost, d, now, &inner.dropped);
                    keys.insert(c.key.to_owned(), fresh);
                }
                return Ok(d);
            }
        };
        if c.cost > 0 {
            e.wanted = e.wanted.saturating_add(c.cost);
        }
        let Some((state, d)) = decide(c.policy, Some(&e.state), now, c.cost) else {
            return Err(unheld(c.policy));
        };
        let share = if self.alone() {
            u64::MAX
        } else {
            e.allowance_at(now)
        };
        let d = self.within_share(d, c.cost, share, now)?;
        if d.allowed && c.cost > 0 {
            e.commit(c.policy, state, c.cost, d, now, &self.inner.dropped);
        }
        Ok(d)
    }

    /// Room in `keys` for `new` more keys: when the map is full, the spent entries go first;
    /// [`StoreError::Full`] if that is not enough.
    fn make_room(
        &self,
        keys: &mut HashMap<String, Entry>,
        new: usize,
        now: Timestamp,
    ) -> StoreResult<()> {
        let max_keys = self.inner.options.max_keys;
        if new == 0 || keys.len() + new <= max_keys {
            return Ok(());
        }
        keys.retain(|_, e| !e.spent(now));
        if keys.len() + new > max_keys {
            return Err(StoreError::Full { max_keys });
        }
        Ok(())
    }

    /// `d` as this instance may answer it: a request the limit admits but whose cost does not
    /// fit the instance's `share` is refused until the next sync brings a new one, or, when
    /// syncs have failed for so long that the claims this instance held have lapsed, left to the
    /// rule's `on_store_error` (Redis is away).
    fn within_share(
        &self,
        d: Decision,
        cost: u64,
        share: u64,
        now: Timestamp,
    ) -> StoreResult<Decision> {
        if !d.allowed || cost <= share {
            return Ok(d);
        }
        let inner = &self.inner;
        let lag = now.saturating_since(Timestamp::from_nanos(
            inner.last_sync.load(Ordering::Relaxed),
        ));
        if inner.away.load(Ordering::Relaxed) && lag >= self.claim_ttl() / 2 {
            return Err(StoreError::Unavailable(format!(
                "the hybrid store has not synced with Redis for {lag:?}, and this \
                 instance's share of the limit is used up or has lapsed"
            )));
        }
        Ok(Decision {
            allowed: false,
            remaining: d.remaining.min(share),
            retry_after: inner.options.sync_interval,
            ..d
        })
    }

    /// Decides `checks` on `keys`, all or nothing: the general path, for requests of several
    /// checks and for keys not tracked yet.
    fn check_with(
        &self,
        keys: &mut HashMap<String, Entry>,
        checks: &[Check<'_>],
        now: Timestamp,
    ) -> StoreResult<Vec<Decision>> {
        let inner = &self.inner;
        // Room for the keys this request would create, made before anything is decided.
        let new = checks
            .iter()
            .filter(|c| c.cost > 0 && !keys.contains_key(c.key))
            .count();
        self.make_room(keys, new, now)?;
        for c in checks.iter().filter(|c| c.cost > 0) {
            if let Some(e) = keys.get_mut(c.key) {
                e.wanted = e.wanted.saturating_add(c.cost);
            }
        }
        // Each check sees what the earlier checks of this request would leave on its key.
        let mut after: Vec<(&str, &Policy, Local)> = Vec::with_capacity(checks.len());
        let mut decisions = Vec::with_capacity(checks.len());
        for (i, c) in checks.iter().enumerate() {
            let earlier = after
                .iter()
                .rev()
                .find(|(k, p, _)| *k == c.key && *p == c.policy);
            let stored = match earlier {
                Some((_, _, s)) => Some(*s),
                None => keys
                    .get(c.key)
                    .filter(|e| e.policy == *c.policy)
                    .map(|e| e.state),
            };
            let Some((state, d)) = decide(c.policy, stored.as_ref(), now, c.cost) else {
                return Err(unheld(c.policy));
            };
            // This instance's share, less what earlier checks of this request on the key take.
            let share = if self.alone() {
                u64::MAX
            } else {
                keys.get(c.key)
                    .filter(|e| e.policy == *c.policy)
                    .map_or_else(|| self.share(c.policy.limit()), |e| e.allowance_at(now))
            };
            let taken: u64 = checks[..i]
                .iter()
                .filter(|e| e.key == c.key && e.policy == c.policy)
                .map(|e| e.cost)
                .sum();
            let d = self.within_share(d, c.cost, share.saturating_sub(taken), now)?;
            if d.allowed && c.cost > 0 {
                after.push((c.key, c.policy, state));
            }
            decisions.push(d);
        }
        if !decisions.iter().all(|d| d.allowed) {
            return Ok(sluice_core::unconsumed(checks, decisions));
        }
        for (c, d) in checks.iter().zip(&decisions) {
            if c.cost == 0 {
                continue;
            }
            let Some(&(_, _, state)) = after.iter().find(|(k, p, _)| *k == c.key && *p == c.policy)
            else {
                continue;
            };
            let entry = match keys.get_mut(c.key) {
                Some(e) => e,
                None => {
                    let mut fresh = Entry::new(c.policy, state, now, self.share(c.policy.limit()));
                    fresh.wanted = c.cost;
                    keys.entry(c.key.to_owned()).or_insert(fresh)
                }
            };
            if entry.policy != *c.policy {
                // The key's policy changed with the rules: start it afresh.
                entry.policy = c.policy.clone();
                entry.pending.clear();
            }
            entry.commit(c.policy, state, c.cost, *d, now, &inner.dropped);
        }
        // A key repeated in the request keeps the state its last check left.
        for (k, p, state) in after.iter().rev() {
            if let Some(e) = keys.get_mut(*k) {
                if e.policy == **p {
                    e.state = *state;
                    break;
                }
            }
        }
        Ok(decisions)
    }
}

/// How a sync's grants may be used.
#[derive(Debug, Clone, Copy)]
struct Grants {
    /// Until when: their claims could expire after that.
    until: Timestamp,
    /// Whether the sync was made as a lone instance, which reserves only what it kept.
    claimed_alone: bool,
}

/// How many keys a sync's answer updates under one hold of the key map's lock, and between two
/// yields of the sync task: small enough that a request waits tens of microseconds behind it,
/// large enough that the lock is taken rarely.
const APPLY_CHUNK: usize = 64;

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

/// Whether `policy` is a bucket (token bucket or GCRA), whose units are dated by when they were
/// admitted rather than by a window.
fn is_bucket(policy: &Policy) -> bool {
    matches!(policy, Policy::TokenBucket(_) | Policy::Gcra(_))
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
        // Long enough for the next syncs to read it.
        let watch = now.saturating_add(inner.options.sync_interval * 4);
        if let Some(e) = keys.get_mut(key).filter(|e| e.policy == *policy) {
            e.expires = e.expires.max(watch);
        } else if keys.len() < inner.options.max_keys {
            keys.insert(
                key.to_owned(),
                Entry::new(policy, fresh, watch, self.share(policy.limit())),
            );
        }
        Ok(d)
    }

    async fn reset(&self, key: &str) -> StoreResult<bool> {
        let local = lock(&self.inner.keys).remove(key).is_some();
        let global = self.inner.redis.reset_hybrid(key).await?;
        Ok(local || global)
    }

    fn tracked_keys(&self) -> Option<usize> {
        Some(lock(&self.inner.keys).len())
    }

    fn supports(&self, policy: &Policy) -> Result<(), UnsupportedPolicy> {
        hybrid_supports(policy)
    }
}

/// The error for a check of a policy this store does not hold. Rules are refused at load by
/// [`Store::supports`], so this is only met by a caller that skipped that gate.
fn unheld(policy: &Policy) -> StoreError {
    StoreError::Rejected(hybrid_supports(policy).err().map_or_else(
        || format!("the hybrid store does not hold {}", policy.algorithm()),
        |u| u.to_string(),
    ))
}
