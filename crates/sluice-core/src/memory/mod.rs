//! The in-memory store: the default, for one instance.
//!
//! Counters live in a fixed number of shards, each a mutex around a hash map, so threads working
//! on different keys rarely meet. A check of several keys locks their shards in ascending order,
//! which rules out deadlock, and decides every check before it changes anything, which makes it
//! all-or-nothing. See `docs/memory-store.md` for the layout, expiry and eviction.

mod adjust;
mod fingerprint;
mod reservations;
mod shard;
mod state;

use std::sync::{Mutex, MutexGuard};

use fingerprint::{Fingerprint, Fingerprinter};
use reservations::{Hold, Holds, Reservations};
use shard::Shard;
use state::{Meta, Update, apply, decide, decide_in_place};

use crate::clock::duration_nanos;
use crate::{
    Adjustment, Check, Clock, Decision, Lease, Policy, Refund, ReservationId, Settlement, Store,
    StoreResult, SystemClock, Timestamp, UnsupportedPolicy,
};

/// The default hard limit on tracked keys: about 100 MB of counters.
pub const DEFAULT_MAX_KEYS: usize = 1 << 20;

/// A shard on its own cache lines, so that threads on neighbouring shards do not contend.
#[repr(align(128))]
#[derive(Debug)]
struct PaddedShard(Mutex<Shard>);

/// Counters in this process's memory. Cheap to share behind an `Arc`.
///
/// ```
/// use sluice_core::{Check, FakeClock, MemoryStore, Policy, Rate, Store, Timestamp, TokenBucket};
///
/// # tokio_test_block_on(async {
/// let clock = FakeClock::at(Timestamp::from_secs(1_000));
/// let store = MemoryStore::builder().clock(clock.clone()).build();
/// let policy = Policy::from(TokenBucket::new(2, Rate::per_second(1)).unwrap());
/// let check = [Check::new("user:42", &policy, 1)];
/// assert!(store.check(&check).await.unwrap()[0].allowed);
/// assert!(store.check(&check).await.unwrap()[0].allowed);
/// assert!(!store.check(&check).await.unwrap()[0].allowed);
/// clock.advance(std::time::Duration::from_secs(1));
/// assert!(store.check(&check).await.unwrap()[0].allowed);
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Debug)]
pub struct MemoryStore<C: Clock = SystemClock> {
    shards: Box<[PaddedShard]>,
    /// `shards.len() - 1`; the shard count is a power of two.
    shard_mask: usize,
    fingerprints: Fingerprinter,
    clock: C,
    /// Expiry times are stored as whole seconds after this instant, to keep entries small.
    base: Timestamp,
    max_keys: usize,
    /// Reservations not yet forgotten, at most `max_keys` of them.
    reservations: Reservations,
}

/// Configures a [`MemoryStore`].
#[derive(Debug)]
pub struct MemoryStoreBuilder<C: Clock = SystemClock> {
    clock: C,
    max_keys: usize,
    shards: usize,
}

impl MemoryStore<SystemClock> {
    /// A store on the system clock with the default key limit.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// Configure a store.
    pub fn builder() -> MemoryStoreBuilder<SystemClock> {
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        MemoryStoreBuilder {
            clock: SystemClock::new(),
            max_keys: DEFAULT_MAX_KEYS,
            shards: (threads * 16).next_power_of_two().clamp(16, 1024),
        }
    }
}

impl Default for MemoryStore<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> MemoryStoreBuilder<C> {
    /// The clock the store reads once per call. Tests pass a [`crate::FakeClock`].
    pub fn clock<D: Clock>(self, clock: D) -> MemoryStoreBuilder<D> {
        MemoryStoreBuilder {
            clock,
            max_keys: self.max_keys,
            shards: self.shards,
        }
    }

    /// The hard limit on tracked keys. Each shard holds at most its share of it, so a flood of
    /// distinct keys cannot grow memory past it.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// How many shards to spread keys over, rounded up to a power of two. More shards mean less
    /// contention; each shard holds `max_keys / shards` keys at most.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.clamp(1, 1 << 16).next_power_of_two();
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore<C> {
        let shards = self.shards.min(self.max_keys.next_power_of_two());
        let per_shard = self.max_keys.div_ceil(shards);
        MemoryStore {
            shards: (0..shards)
                .map(|_| PaddedShard(Mutex::new(Shard::new(per_shard))))
                .collect(),
            shard_mask: shards - 1,
            fingerprints: Fingerprinter::random(),
            base: self.clock.now(),
            clock: self.clock,
            max_keys: self.max_keys,
            reservations: Reservations::new(self.max_keys),
        }
    }
}

impl<C: Clock> MemoryStore<C> {
    /// The store's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The hard limit on tracked keys.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// How many counters are tracked, expired ones not yet swept included.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(&s.0).map.len()).sum()
    }

    /// Whether no counter is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired counter now. Stores sweep as they grow anyway; a server may also call
    /// this periodically so that memory shrinks after a burst of keys.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        self.reservations.sweep(now);
        let now = self.secs(now);
        self.shards.iter().map(|s| lock(&s.0).sweep(now)).sum()
    }

    /// Decides one check: the same as [`Store::check`] with one element, without the future and
    /// the vector, for callers in the same process.
    pub fn check_one(&self, check: Check<'_>) -> StoreResult<Decision> {
        self.check_one_at(check, self.fingerprints.of(check.key), self.clock.now())
    }

    /// Decides one check of the counter with fingerprint `fp` at `now`. Inlined into its two
    /// callers: as a call of its own, its frame and the decision copied out of it were 26 of a
    /// hot-key GCRA decision's 363 instructions.
    #[inline(always)]
    fn check_one_at(
        &self,
        check: Check<'_>,
        fp: Fingerprint,
        now: Timestamp,
    ) -> StoreResult<Decision> {
        let mut shard = lock(&self.shards[self.shard_of(fp)].0);
        if let Some(entry) = shard.map.get_mut(&fp) {
            let d = decide_in_place(check.policy, entry, now, check.cost);
            let meta = entry.meta_mut();
            if d.allowed && check.cost > 0 {
                meta.expires = self.expiry(now, &d);
            }
            meta.limited = is_limited(&d);
            return Ok(d);
        }
        let (update, d) = decide(check.policy, None, now, check.cost);
        if d.allowed && check.cost > 0 {
            shard.make_room(1, self.secs(now), self.max_keys)?;
            if let Some(mut entry) = apply(check.policy, None, update, now) {
                *entry.meta_mut() = self.meta(now, &d);
                shard.map.insert(fp, entry);
            }
        }
        Ok(d)
    }

    /// Decides several checks atomically.
    fn check_all(&self, checks: &[Check<'_>]) -> StoreResult<Vec<Decision>> {
        self.check_all_at(checks, self.clock.now())
    }

    /// Decides several checks atomically at `now`.
    fn check_all_at(&self, checks: &[Check<'_>], now: Timestamp) -> StoreResult<Vec<Decision>> {
        let now_secs = self.secs(now);
        let keys: Vec<(Fingerprint, usize)> = checks
            .iter()
            .map(|c| {
                let fp = self.fingerprints.of(c.key);
                (fp, self.shard_of(fp))
            })
            .collect();
        // Lock every shard involved, in ascending order, so two multi-key checks never wait on
        // each other in a cycle.
        let mut order: Vec<usize> = keys.iter().map(|(_, s)| *s).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<MutexGuard<'_, Shard>> =
            order.iter().map(|&s| lock(&self.shards[s].0)).collect();
        let guard_of = |shard: usize| order.binary_search(&shard).unwrap_or(0);

        // Room for the keys this request would create, made before anything is decided, so
        // that the commit below cannot fail halfway.
        for (g, shard) in order.iter().enumerate() {
            let mut new: Vec<Fingerprint> = Vec::new();
            for (c, (fp, s)) in checks.iter().zip(&keys) {
                if s == shard && c.cost > 0 && !guards[g].map.contains_key(fp) && !new.contains(fp)
                {
                    new.push(*fp);
                }
            }
            if !new.is_empty() {
                guards[g].make_room(new.len(), now_secs, self.max_keys)?;
            }
        }

        // Decide every check against the state as it stands, or, for a key that appears more
        // than once, against the state the earlier checks of this request would leave.
        let mut decisions = Vec::with_capacity(checks.len());
        let mut updates: Vec<Option<Update>> = Vec::with_capacity(checks.len());
        let mut repeated: Vec<Repeated> = Vec::new();
        for (i, (c, (fp, s))) in checks.iter().zip(&keys).enumerate() {
            let stored = guards[guard_of(*s)].map.get(fp);
            let appears_again = keys.iter().enumerate().any(|(j, (o, _))| j != i && o == fp);
            if !appears_again {
                let (update, d) = decide(c.policy, stored, now, c.cost);
                updates.push((d.allowed && c.cost > 0).then_some(update));
                decisions.push(d);
                continue;
            }
            let slot = match repeated.iter().position(|r| r.fp == *fp) {
                Some(p) => p,
                None => {
                    repeated.push(Repeated {
                        fp: *fp,
                        shard: *s,
                        state: stored.cloned(),
                        last: None,
                    });
                    repeated.len() - 1
                }
            };
            let r = &mut repeated[slot];
            let (update, d) = decide(c.policy, r.state.as_ref(), now, c.cost);
            if d.allowed && c.cost > 0 {
                if let Some(fresh) = apply(c.policy, r.state.as_mut(), update, now) {
                    r.state = Some(fresh);
                }
                r.last = Some(d);
            }
            updates.push(None);
            decisions.push(d);
        }

        if !decisions.iter().all(|d| d.allowed) {
            // Nothing consumes; only remember which counters refused, for eviction.
            for ((fp, s), d) in keys.iter().zip(&decisions) {
                if let Some(entry) = guards[guard_of(*s)].map.get_mut(fp) {
                    entry.meta_mut().limited |= !d.allowed;
                }
            }
            return Ok(unconsumed(checks, decisions));
        }
        for ((c, (fp, s)), (update, d)) in checks
            .iter()
            .zip(&keys)
            .zip(updates.into_iter().zip(&decisions))
        {
            if let Some(update) = update {
                self.commit(&mut guards[guard_of(*s)], *fp, c.policy, update, now, d);
            }
        }
        for r in repeated {
            if let (Some(mut entry), Some(d)) = (r.state, r.last) {
                *entry.meta_mut() = self.meta(now, &d);
                guards[guard_of(r.shard)].map.insert(r.fp, entry);
            }
        }
        Ok(decisions)
    }

    /// Applies an admitted request's update to the key's entry, creating it if needed. Room was
    /// made beforehand.
    fn commit(
        &self,
        shard: &mut Shard,
        fp: Fingerprint,
        policy: &Policy,
        update: Update,
        now: Timestamp,
        d: &Decision,
    ) {
        let meta = self.meta(now, d);
        match shard.map.get_mut(&fp) {
            Some(entry) => {
                if let Some(fresh) = apply(policy, Some(entry), update, now) {
                    *entry = fresh;
                }
                *entry.meta_mut() = meta;
            }
            None => {
                if let Some(mut entry) = apply(policy, None, update, now) {
                    *entry.meta_mut() = meta;
                    shard.map.insert(fp, entry);
                }
            }
        }
    }

    fn shard_of(&self, fp: Fingerprint) -> usize {
        (fp.hi as usize) & self.shard_mask
    }

    /// `t` in whole seconds after the base time, rounded down.
    fn secs(&self, t: Timestamp) -> u32 {
        let secs = t.saturating_since(self.base).as_secs();
        u32::try_from(secs).unwrap_or(u32::MAX)
    }

    /// The bookkeeping on a counter left by decision `d` at `now`.
    fn meta(&self, now: Timestamp, d: &Decision) -> Meta {
        Meta {
            expires: self.expiry(now, d),
            limited: is_limited(d),
        }
    }

    /// When a counter left by decision `d` at `now` is full again, in stored form.
    fn expiry(&self, now: Timestamp, d: &Decision) -> u32 {
        // In nanoseconds rather than through `Duration`, which would split and join seconds
        // and nanoseconds three times over.
        let at = now
            .as_nanos()
            .saturating_add(duration_nanos(d.reset_after))
            .saturating_sub(self.base.as_nanos());
        u32::try_from(at.div_ceil(1_000_000_000)).unwrap_or(u32::MAX)
    }

    /// The decision a cost-0 check of `key` would get now, creating and changing nothing: the
    /// same as [`Store::peek`], without the future, for callers in the same process.
    pub fn peek_one(&self, key: &str, policy: &Policy) -> Decision {
        let now = self.clock.now();
        let fp = self.fingerprints.of(key);
        let shard = lock(&self.shards[self.shard_of(fp)].0);
        decide(policy, shard.map.get(&fp), now, 0).1
    }

    /// How many reservations are remembered, settled and expired ones included, until they are
    /// forgotten twice their ttl after they were made.
    pub fn reservations(&self) -> usize {
        self.reservations.len()
    }

    /// The checks of a reservation, and its record when they all admit: see [`Store::reserve`].
    fn reserve_now(&self, checks: &[Check<'_>], lease: Lease<'_>) -> StoreResult<Vec<Decision>> {
        let now = self.clock.now();
        self.reservations.make_room(*lease.id, now)?;
        // One check, as most reservations are, goes the way of a single `/v1/check`: one
        // fingerprint, kept for the hold, and none of the multi-key path's vectors.
        let (decisions, holds) = match checks {
            [one] => {
                let fp = self.fingerprints.of(one.key);
                let d = self.check_one_at(*one, fp, now)?;
                (vec![d], Holds::One(Hold::of(one, fp)))
            }
            many => {
                let decisions = self.check_all_at(many, now)?;
                let holds = many
                    .iter()
                    .map(|c| Hold::of(c, self.fingerprints.of(c.key)))
                    .collect();
                (decisions, Holds::Many(holds))
            }
        };
        if decisions.iter().all(|d| d.allowed) {
            self.reservations.insert(*lease.id, holds, now, lease.ttl);
        }
        Ok(decisions)
    }

    /// Settles a reservation: see [`Store::settle`].
    fn settle_now(&self, id: &ReservationId, used: u64) -> StoreResult<Settlement> {
        let now = self.clock.now();
        let claim = match self.reservations.claim(*id, now) {
            Ok(claim) => claim,
            Err(why) => return Ok(why),
        };
        let holds = claim.holds.as_slice();
        let reserved = holds.iter().map(|h| h.cost).max().unwrap_or(0);
        // Last check first, as the Redis store adjusts them: where two checks of a reservation
        // share a counter, a refund capped at the capacity or two charges each rounded up to
        // whole nanoseconds leave it otherwise in the other order.
        for hold in holds.iter().rev() {
            match Adjustment::of(hold.policy.algorithm(), hold.cost, used) {
                Some(Adjustment::Refund(units)) => {
                    self.give_back(hold.fp, &hold.policy, units, claim.taken_at, now);
                }
                Some(Adjustment::Charge(units)) => {
                    self.charge(hold.fp, &hold.policy, units, now)?;
                }
                None => {}
            }
        }
        Ok(Settlement::Settled {
            reserved,
            refunded: reserved.saturating_sub(used),
            charged: used.saturating_sub(reserved),
        })
    }

    /// Gives `units` taken at `taken_at` back to the counter with fingerprint `fp`, if it is
    /// still tracked.
    fn give_back(
        &self,
        fp: Fingerprint,
        policy: &Policy,
        units: u64,
        taken_at: Timestamp,
        now: Timestamp,
    ) {
        let mut shard = lock(&self.shards[self.shard_of(fp)].0);
        if let Some(entry) = shard.map.get_mut(&fp) {
            adjust::refund(policy, entry, units, taken_at, now);
            entry.meta_mut().limited = false;
        }
    }

    /// Charges `units` to the counter `key` under `policy` now, past its limit if need be, as
    /// Envoy's usage report counts what a response used: the next request is refused until
    /// the algorithm has earned the units back. Fails only when the store is full of limited
    /// keys and cannot track a new one.
    pub fn charge_one(&self, key: &str, policy: &Policy, units: u64) -> StoreResult<()> {
        self.charge(self.fingerprints.of(key), policy, units, self.clock.now())
    }

    /// Charges `units` to the counter with fingerprint `fp` whatever it holds, tracking it if
    /// it is not yet.
    fn charge(
        &self,
        fp: Fingerprint,
        policy: &Policy,
        units: u64,
        now: Timestamp,
    ) -> StoreResult<()> {
        let mut shard = lock(&self.shards[self.shard_of(fp)].0);
        if let Some(entry) = shard.map.get_mut(&fp) {
            if let Some(fresh) = adjust::charge(policy, Some(entry), units, now) {
                *entry = fresh;
            }
            // The counter is full again later than before: its expiry follows.
            let d = decide(policy, Some(entry), now, 0).1;
            *entry.meta_mut() = self.meta(now, &d);
            return Ok(());
        }
        shard.make_room(1, self.secs(now), self.max_keys)?;
        if let Some(mut entry) = adjust::charge(policy, None, units, now) {
            let d = decide(policy, Some(&entry), now, 0).1;
            *entry.meta_mut() = self.meta(now, &d);
            shard.map.insert(fp, entry);
        }
        Ok(())
    }

    /// Gives units back outside a reservation: see [`Store::refund`].
    fn refund_now(&self, refunds: &[Refund<'_>]) -> Vec<Decision> {
        let now = self.clock.now();
        refunds
            .iter()
            .map(|r| {
                if r.units > 0 {
                    let fp = self.fingerprints.of(r.key);
                    self.give_back(fp, r.policy, r.units, now, now);
                }
                self.peek_one(r.key, r.policy)
            })
            .collect()
    }

    fn remove(&self, key: &str) -> bool {
        let fp = self.fingerprints.of(key);
        lock(&self.shards[self.shard_of(fp)].0)
            .map
            .remove(&fp)
            .is_some()
    }
}

/// A key that appears more than once in one multi-key check: its state as the earlier checks of
/// the request would leave it.
struct Repeated {
    fp: Fingerprint,
    shard: usize,
    state: Option<state::State>,
    /// The last admitting decision on it, which describes the state to store.
    last: Option<Decision>,
}

/// The decisions of a refused multi-key request: a check that would have admitted reports its
/// counter as it stands, since the request consumed nothing from it. Every store applies this,
/// so that all report a refused request alike.
pub fn unconsumed(checks: &[Check<'_>], mut decisions: Vec<Decision>) -> Vec<Decision> {
    for (c, d) in checks.iter().zip(&mut decisions) {
        if d.allowed {
            d.remaining = d.remaining.saturating_add(c.cost).min(d.limit);
        }
    }
    decisions
}

/// Whether a counter left by decision `d` counts as limited for eviction.
fn is_limited(d: &Decision) -> bool {
    !d.allowed || d.remaining == 0
}

/// Locks a shard. A panic while holding the lock cannot leave a counter half-written (every
/// update is a single assignment), so a poisoned lock is still safe to use.
fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<C: Clock + 'static> Store for MemoryStore<C> {
    async fn check(&self, checks: &[Check<'_>]) -> StoreResult<Vec<Decision>> {
        match checks {
            [] => Ok(Vec::new()),
            [one] => self.check_one(*one).map(|d| vec![d]),
            many => self.check_all(many),
        }
    }

    fn check_now(&self, check: Check<'_>) -> Option<StoreResult<Decision>> {
        Some(self.check_one(check))
    }

    async fn peek(&self, key: &str, policy: &Policy) -> StoreResult<Decision> {
        Ok(self.peek_one(key, policy))
    }

    async fn reset(&self, key: &str) -> StoreResult<bool> {
        Ok(self.remove(key))
    }

    fn tracked_keys(&self) -> Option<usize> {
        Some(self.len())
    }

    /// What the algorithm table says of the memory store.
    fn supports(&self, policy: &Policy) -> Result<(), UnsupportedPolicy> {
        let algorithm = policy.algorithm();
        algorithm.spec().stores.memory.check("memory", algorithm)
    }

    async fn reserve(&self, checks: &[Check<'_>], lease: Lease<'_>) -> StoreResult<Vec<Decision>> {
        self.reserve_now(checks, lease)
    }

    async fn settle(&self, id: &ReservationId, used: u64) -> StoreResult<Settlement> {
        self.settle_now(id, used)
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> StoreResult<Vec<Decision>> {
        Ok(self.refund_now(refunds))
    }
}
