//! [`RedisStore`]: the `Store` contract on Redis standalone, Sentinel or Cluster.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use redis::{RedisError, RedisResult};
use sluice_core::{
    BreakerState, Check, Decision, Lease, Policy, Refund, ReservationId, Settlement,
    SharedOverrides, Store, StoreError, StoreResult, Timestamp, UnsupportedPolicy,
};

use crate::breaker::{Breaker, Permit};
use crate::connection::{Connection, is_transient};
use crate::keys::{counter_key, counter_key_with, escape, slot};
use crate::masters::Master;
use crate::scripts;
use crate::scripts::args::{ARGS_PER_CHECK, Arg, app_now, push_check};
use crate::scripts::exact::check_exact;
use crate::scripts::reply::{Reply, decode_replies};
use crate::url::{RedisUrl, Topology};
use crate::{ConnectError, MasterHealth, RedisOptions};

mod master_calls;
mod overrides;
mod reservations;

/// Counters in Redis, shared exactly by every instance that uses the same Redis and prefix.
///
/// Each [`Store::check`] is one atomic Lua script per Cluster slot that its keys fall in (on
/// standalone and Sentinel, one script in all), deciding on Redis `TIME`; on a Cluster the
/// scripts of one master go as one pipeline, and the masters in parallel. Cheap to clone: clones
/// share connections, breakers and statistics.
///
/// Every call has a timeout, and a circuit breaker (one per master on a Cluster) fails calls at
/// once while Redis is down; see `docs/redis-store.md`.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Connection,
    /// Whether checks must be split by slot (Cluster), or may share one script (otherwise).
    cluster: bool,
    /// The key prefix, escaped.
    prefix: String,
    timeout: Duration,
    cool_down: Duration,
    /// The breaker of every call off a Cluster; on one, of the calls that go through the
    /// Cluster connection rather than to a known master (`PING`, a slot whose master the map
    /// does not know). Each master has its own (`masters.rs`).
    breaker: Breaker,
    /// Nanoseconds added to Redis time by every script: a test and skew hook, 0 in production.
    offset: AtomicI64,
    /// Nanoseconds added to the application clock where the store reads it (only to pick a
    /// reference window start): a test hook that shows application skew changes nothing.
    app_skew: AtomicI64,
    /// The microseconds since the epoch that this store's scripts read in place of Redis `TIME`,
    /// or 0 for Redis `TIME` itself: see [`RedisStore::freeze_time`].
    #[cfg(feature = "testing")]
    frozen: AtomicU64,
    /// Cross-slot refunds that failed, leaving their reservation until the counter refills.
    refund_failures: AtomicU64,
    /// Requests whose checks spanned slots and were reserved and refunded.
    refunds: AtomicU64,
    /// Where the store connects, password masked, for messages.
    target: String,
}

/// Counters of a store's health, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisStats {
    /// The circuit breaker's state: anything but closed means Redis is considered down. On a
    /// Cluster, the worst of every master's breaker (open if any is open; see
    /// [`RedisStore::masters`] for each).
    pub breaker: BreakerState,
    /// Calls failed at once because the breaker was open (any master's, on a Cluster).
    pub short_circuited: u64,
    /// Multi-slot requests denied by one slot, whose other slots were refunded.
    pub refunds: u64,
    /// Refunds that failed: their units stay consumed until the counters refill, which can
    /// only deny more, never admit more.
    pub refund_failures: u64,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("target", &self.inner.target)
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .field("breaker", &self.breaker_state())
            .finish()
    }
}

impl RedisStore {
    /// Connects to the Redis that `url` names: `redis://`, `rediss://`, `redis+sentinel://` or
    /// `redis+cluster://` (see [`RedisUrl`]). This is what a `--store` URL becomes.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), sluice_redis::ConnectError> {
    /// use sluice_redis::{RedisOptions, RedisStore};
    /// let store = RedisStore::connect("redis://127.0.0.1:6379", RedisOptions::default()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self, ConnectError> {
        Self::connect_to(&RedisUrl::parse(url)?, options).await
    }

    /// Connects to a parsed URL.
    pub async fn connect_to(url: &RedisUrl, options: RedisOptions) -> Result<Self, ConnectError> {
        let target = url.to_string();
        let connecting = Connection::connect(url, &options);
        let conn = match tokio::time::timeout(options.connect_timeout, connecting).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(source)) => return Err(ConnectError::Connect { target, source }),
            Err(_) => {
                return Err(ConnectError::Timeout {
                    target,
                    timeout: options.connect_timeout,
                });
            }
        };
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn,
                cluster: matches!(url.topology, Topology::Cluster { .. }),
                prefix: escape(&options.prefix).into_owned(),
                timeout: options.timeout,
                cool_down: options.breaker_cool_down,
                breaker: Breaker::new(options.breaker_threshold, options.breaker_cool_down),
                offset: AtomicI64::new(0),
                app_skew: AtomicI64::new(0),
                #[cfg(feature = "testing")]
                frozen: AtomicU64::new(0),
                refund_failures: AtomicU64::new(0),
                refunds: AtomicU64::new(0),
                target,
            }),
        })
    }

    /// The SHA1 of the check script, which every decision runs by `EVALSHA`: for operators who
    /// preload scripts, and for benchmarks that call it directly (`redis-benchmark`).
    pub fn check_script_sha(&self) -> &str {
        &scripts::CHECK.sha
    }

    /// The circuit breaker's state, for `/readyz` and metrics. On a Cluster, the worst of the
    /// masters' breakers: open while any master's is open, though the keys of the others are
    /// still decided exactly ([`RedisStore::masters`] says which).
    pub fn breaker_state(&self) -> BreakerState {
        let worst = |a: BreakerState, b: BreakerState| {
            let rank = |s| match s {
                BreakerState::Closed => 0,
                BreakerState::HalfOpen => 1,
                BreakerState::Open => 2,
            };
            if rank(b) > rank(a) { b } else { a }
        };
        self.masters()
            .iter()
            .map(|m| m.breaker)
            .fold(self.inner.breaker.state(), worst)
    }

    /// Each Cluster master's health: its address, its breaker, the calls its breaker failed at
    /// once, and the round trips made to it. Empty off a Cluster, where the store's one breaker
    /// is [`RedisStore::breaker_state`].
    pub fn masters(&self) -> Vec<MasterHealth> {
        self.inner
            .conn
            .masters()
            .map_or_else(Vec::new, |m| m.health())
    }

    /// Health counters, for metrics.
    pub fn stats(&self) -> RedisStats {
        let masters = self.masters();
        RedisStats {
            breaker: self.breaker_state(),
            short_circuited: self.inner.breaker.short_circuited()
                + masters.iter().map(|m| m.short_circuited).sum::<u64>(),
            refunds: self.inner.refunds.load(Ordering::Relaxed),
            refund_failures: self.inner.refund_failures.load(Ordering::Relaxed),
        }
    }

    /// Asks Redis for a `PING`, through the breaker and the timeout: a readiness probe.
    pub async fn ping(&self) -> StoreResult<()> {
        let cmd = redis::cmd("PING");
        self.guarded(self.inner.conn.send(&cmd)).await.map(|_| ())
    }

    /// The Redis key that holds the counter `identity`: `prefix:identity` when the identity
    /// opens with its own hash tag, as every rule key does (`{domain|key=value}:policy`), and
    /// `prefix:{identity}` with braces escaped otherwise.
    pub fn key_of(&self, identity: &str) -> String {
        counter_key(&self.inner.prefix, identity)
    }

    /// [`RedisStore::key_of`] with `suffix` appended, in one allocation: the key of a counter
    /// another store keeps beside this one's in the same slot (the hybrid store's `:h`).
    pub fn key_of_with(&self, identity: &str, suffix: &str) -> String {
        counter_key_with(&self.inner.prefix, identity, suffix)
    }

    /// The Cluster slot of the counter `identity`.
    pub fn slot_of(&self, identity: &str) -> u16 {
        slot(self.key_of(identity).as_bytes())
    }

    /// **Test and skew hook.** Nanoseconds added to Redis `TIME` in every script of this store,
    /// 0 unless set. Tests move a store's time with it instead of sleeping; it can also model an
    /// instance whose view of the store's clock is off. Limits stay exact only among stores with
    /// the same offset: production code never sets it.
    pub fn time_offset(&self) -> i64 {
        self.inner.offset.load(Ordering::SeqCst)
    }

    /// **Test and skew hook.** Sets [`RedisStore::time_offset`].
    pub fn set_time_offset(&self, nanos: i64) {
        self.inner.offset.store(nanos, Ordering::SeqCst);
    }

    /// **Test and skew hook.** Moves this store's time forward by `d`
    /// (see [`RedisStore::time_offset`]).
    pub fn advance_time(&self, d: Duration) {
        let step = i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        let _ = self
            .inner
            .offset
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |o| {
                Some(o.saturating_add(step))
            });
    }

    /// **Test and skew hook.** Shifts this process's clock, as the store sees it, by `nanos`.
    ///
    /// The store reads the application clock only to name some window start near now for
    /// clock-aligned windows; the script then finds the window `now` falls in on Redis time.
    /// Decisions therefore do not depend on the application clock, which tests show by skewing
    /// it by hours.
    pub fn set_app_clock_skew(&self, nanos: i64) {
        self.inner.app_skew.store(nanos, Ordering::SeqCst);
    }

    /// The application's time as the store uses it: the wall clock, shifted by both hooks.
    fn app_now(&self, offset: i64) -> Timestamp {
        let shift = offset.saturating_add(self.inner.app_skew.load(Ordering::Relaxed));
        #[cfg(feature = "testing")]
        if let Some(at) = self.frozen_at() {
            let shifted = i128::from(at.as_nanos()) + i128::from(shift);
            return Timestamp::from_nanos(u64::try_from(shifted.max(0)).unwrap_or(u64::MAX));
        }
        app_now(shift)
    }

    /// **Test hook.** Stops this store's clock: from now on its scripts read `at` (to the
    /// microsecond below, the precision of Redis `TIME`) in place of Redis `TIME`, plus the
    /// [`RedisStore::time_offset`] as before, and so does its application clock. Redis time
    /// never stands still, so without this a store's answers (a `retry_after`, a window's end)
    /// differ from another store's at the same instant by the microseconds each call takes;
    /// frozen, they can be compared to the nanosecond with the memory store on a
    /// [`FakeClock`](sluice_core::FakeClock). Redis still expires keys on its own clock, so a
    /// test that keeps a counter for long in real time persists it.
    ///
    /// The scripts run are copies of the store's own with `TIME` replaced by `at`, loaded by
    /// `EVAL` on their first call.
    #[cfg(feature = "testing")]
    pub fn freeze_time(&self, at: Timestamp) {
        let micros = (at.as_nanos() / 1_000).max(1);
        self.inner.frozen.store(micros, Ordering::SeqCst);
    }

    /// The time [`RedisStore::freeze_time`] stopped the clock at, if it did.
    #[cfg(feature = "testing")]
    fn frozen_at(&self) -> Option<Timestamp> {
        match self.inner.frozen.load(Ordering::SeqCst) {
            0 => None,
            micros => Some(Timestamp::from_nanos(micros.saturating_mul(1_000))),
        }
    }

    /// The script to run for `script`: itself, or on a frozen clock its copy that reads the
    /// frozen time (see [`RedisStore::freeze_time`]).
    #[inline(always)]
    pub(crate) fn script(&self, script: &'static scripts::Script) -> &'static scripts::Script {
        #[cfg(feature = "testing")]
        if let Some(at) = self.frozen_at() {
            return crate::testing::frozen_script(script, at);
        }
        script
    }

    /// Whether the store is on a Cluster, where calls are split by slot.
    pub fn is_cluster(&self) -> bool {
        self.inner.cluster
    }

    /// The connection, for calls made outside this file (`calls.rs`, `heartbeat.rs`).
    pub(crate) fn connection(&self) -> &Connection {
        &self.inner.conn
    }

    /// Runs `call` (a command without a deadline of its own) through the breaker and the store's
    /// timeout, and records how it went.
    pub(crate) async fn guarded<T>(
        &self,
        call: impl Future<Output = RedisResult<T>>,
    ) -> StoreResult<T> {
        self.guarded_on(None, call).await
    }

    /// [`RedisStore::guarded`] through the breaker of `master` (on a Cluster, the master of the
    /// key the call is about), or the store's for `None`.
    pub(crate) async fn guarded_on<T>(
        &self,
        master: Option<&Arc<Master>>,
        call: impl Future<Output = RedisResult<T>>,
    ) -> StoreResult<T> {
        let inner = &self.inner;
        let breaker = self.breaker_of(master);
        let Some(permit) = breaker.admit() else {
            return Err(self.breaker_refusal_of(master));
        };
        match tokio::time::timeout(inner.timeout, call).await {
            Ok(result) => self.settle_on(breaker, permit, result),
            Err(_) => {
                breaker.failure(permit);
                Err(StoreError::Timeout(inner.timeout))
            }
        }
    }

    /// How long one call may take.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// [`RedisStore::guarded`] for script calls, which keep their own deadline (the batch task
    /// times them, one timer per batch): `call` gets the deadline, `limit` from now (longer than
    /// the store's timeout for a batch of calls, which Redis runs one after another), and no
    /// timer is armed here. A call that reports a timeout counts as one.
    pub(crate) async fn guarded_by<T, F>(
        &self,
        limit: Duration,
        call: impl FnOnce(tokio::time::Instant) -> F,
    ) -> StoreResult<T>
    where
        F: Future<Output = RedisResult<T>>,
    {
        let breaker = &self.inner.breaker;
        let Some(permit) = breaker.admit() else {
            return Err(self.breaker_refusal());
        };
        match call(tokio::time::Instant::now() + limit).await {
            Err(e) if e.is_timeout() => {
                breaker.failure(permit);
                Err(StoreError::Timeout(limit))
            }
            result => self.settle(permit, result),
        }
    }

    /// Records how a call that ran went with the breaker, and turns its error into the store's.
    fn settle<T>(&self, permit: Permit, result: RedisResult<T>) -> StoreResult<T> {
        self.settle_on(&self.inner.breaker, permit, result)
    }

    /// [`RedisStore::settle`] with `breaker`.
    fn settle_on<T>(
        &self,
        breaker: &Breaker,
        permit: Permit,
        result: RedisResult<T>,
    ) -> StoreResult<T> {
        match result {
            Ok(v) => {
                breaker.success(permit);
                Ok(v)
            }
            Err(e) => {
                let err = self.store_error(&e);
                if err.is_transient() {
                    breaker.failure(permit);
                } else {
                    breaker.success(permit);
                }
                Err(err)
            }
        }
    }

    fn breaker_refusal(&self) -> StoreError {
        StoreError::Unavailable(format!(
            "the circuit breaker is open after repeated failures of redis at {}; a probe call \
             will try again within {:?}",
            self.inner.target, self.inner.cool_down
        ))
    }

    fn store_error(&self, e: &RedisError) -> StoreError {
        if is_transient(e) {
            StoreError::Unavailable(format!("redis at {}: {e}", self.inner.target))
        } else {
            StoreError::Rejected(format!("redis at {}: {e}", self.inner.target))
        }
    }

    /// The arguments of one script call over `checks[idx]` for each index of `group`.
    fn script_args(
        &self,
        checks: &[Check<'_>],
        group: &[usize],
        mode: &str,
        now: Timestamp,
        offset: i64,
        tokens: Option<&[Reply]>,
    ) -> StoreResult<Vec<Arg>> {
        let mut args = Vec::with_capacity(2 + group.len() * ARGS_PER_CHECK);
        args.push(Arg::int(offset));
        args.push(Arg::text(mode));
        for (n, &i) in group.iter().enumerate() {
            let token = tokens.map_or("", |t| t[n].token.as_str());
            push_check(&mut args, checks[i].policy, checks[i].cost, now, token)?;
        }
        Ok(args)
    }

    async fn check_all(&self, checks: &[Check<'_>]) -> StoreResult<Vec<Decision>> {
        let offset = self.time_offset();
        let now = self.app_now(offset);
        let keys: Vec<String> = checks.iter().map(|c| self.key_of(c.key)).collect();
        let (mut decisions, all_allowed) = self
            .decide_groups(checks, &keys, now, offset, |r| r.decision)
            .await?;
        if !all_allowed {
            // The request consumed nothing, so a check that would have admitted reports its
            // counter as it stands, as the memory store does.
            decisions = sluice_core::unconsumed(checks, decisions);
        }
        Ok(decisions)
    }

    /// Decides `checks` (on `keys`), one check script per slot, and commits them when every
    /// check admits; gives back what the slots that admitted consumed when not. Returns what
    /// `pick` makes of each check's reply, in order, and whether every check admitted.
    async fn decide_groups<T>(
        &self,
        checks: &[Check<'_>],
        keys: &[String],
        now: Timestamp,
        offset: i64,
        pick: impl Fn(Reply) -> T,
    ) -> StoreResult<(Vec<T>, bool)> {
        let groups = self.groups(keys);
        let mut calls: Vec<(Cow<'_, [String]>, Vec<Arg>)> = Vec::with_capacity(groups.len());
        for group in &groups {
            let args = self.script_args(checks, group, "1", now, offset, None)?;
            // One group of every key in order (always, off a Cluster) takes them as they are.
            let group_keys = if group.len() == keys.len() {
                Cow::Borrowed(keys)
            } else {
                Cow::Owned(group.iter().map(|&i| keys[i].clone()).collect())
            };
            calls.push((group_keys, args));
        }
        let inner = &self.inner;
        let check = self.script(&scripts::CHECK);
        let (values, first_error) = if let Some(masters) = inner.conn.masters() {
            let calls: Vec<(&[String], &[Arg])> = calls
                .iter()
                .map(|(k, a)| (k.as_ref(), a.as_slice()))
                .collect();
            let results = self
                .eval_by_master(masters, check, &calls, inner.timeout)
                .await;
            let mut first_error = None;
            let mut values = Vec::with_capacity(results.len());
            for result in results {
                match result {
                    Ok(v) => values.push(Some(v)),
                    Err(e) => {
                        first_error.get_or_insert(e);
                        values.push(None);
                    }
                }
            }
            match first_error {
                Some(e) if values.iter().all(Option::is_none) => return Err(e),
                first_error => (values, first_error),
            }
        } else {
            let (values, first_error) = self
                .guarded_by(inner.timeout, |deadline| async move {
                    // One call (every call off a Cluster) needs no join. Its future is small
                    // (the crate's call, off the batch task, is on the heap of its own).
                    let replies = match calls.as_slice() {
                        [(k, a)] => vec![inner.conn.eval(check, k, a, deadline).await],
                        calls => {
                            join_all(
                                calls
                                    .iter()
                                    .map(|(k, a)| inner.conn.eval(check, k, a, deadline)),
                            )
                            .await
                        }
                    };
                    // When every slot failed, the call failed. When only some did, the others are
                    // decoded below so that what they reserved can be given back.
                    let mut first_error = None;
                    let mut values = Vec::with_capacity(replies.len());
                    for reply in replies {
                        match reply {
                            Ok(v) => values.push(Some(v)),
                            Err(e) => {
                                first_error.get_or_insert(e);
                                values.push(None);
                            }
                        }
                    }
                    match first_error {
                        Some(e) if values.iter().all(Option::is_none) => Err(e),
                        first_error => Ok((values, first_error)),
                    }
                })
                .await?;
            let first_error = first_error.map(|e| {
                let err = self.store_error(&e);
                if err.is_transient() {
                    inner.breaker.failure(Permit::Call);
                }
                err
            });
            (values, first_error)
        };
        let mut per_group: Vec<Option<Vec<Reply>>> = Vec::with_capacity(groups.len());
        let mut decode_error = None;
        for (value, group) in values.into_iter().zip(&groups) {
            match value.map(|v| decode_replies(v, group.iter().map(|&i| checks[i].policy.limit())))
            {
                Some(Ok(r)) => per_group.push(Some(r)),
                Some(Err(e)) => {
                    decode_error.get_or_insert(e);
                    per_group.push(None);
                }
                None => per_group.push(None),
            }
        }
        let failed = first_error.is_some() || decode_error.is_some();
        let all_allowed = !failed
            && per_group.iter().all(|g| {
                g.as_ref()
                    .is_some_and(|r| r.iter().all(|r| r.decision.allowed))
            });
        if !all_allowed && groups.len() > 1 {
            self.refund_slots(checks, keys, &groups, &per_group, now, offset)
                .await;
        }
        if let Some(err) = first_error {
            return Err(err);
        }
        if let Some(e) = decode_error {
            return Err(e);
        }
        let mut picked: Vec<Option<T>> =
            std::iter::repeat_with(|| None).take(checks.len()).collect();
        for (group, replies) in groups.iter().zip(per_group) {
            for (&i, r) in group.iter().zip(replies.unwrap_or_default()) {
                picked[i] = Some(pick(r));
            }
        }
        let picked = picked
            .into_iter()
            .map(|d| {
                d.ok_or_else(|| {
                    StoreError::Rejected("the check script left a check undecided".to_owned())
                })
            })
            .collect::<StoreResult<Vec<T>>>()?;
        Ok((picked, all_allowed))
    }

    /// Gives back what the slots that admitted reserved, when another slot refused or failed.
    async fn refund_slots(
        &self,
        checks: &[Check<'_>],
        keys: &[String],
        groups: &[Vec<usize>],
        replies: &[Option<Vec<Reply>>],
        now: Timestamp,
        offset: i64,
    ) {
        let inner = &self.inner;
        let mut calls = Vec::new();
        for (group, replies) in groups.iter().zip(replies) {
            let Some(replies) = replies else { continue };
            if !replies.iter().all(|r| r.decision.allowed) {
                continue; // this slot refused, so it committed nothing
            }
            if checks
                .iter()
                .enumerate()
                .all(|(i, c)| !group.contains(&i) || c.cost == 0)
            {
                continue;
            }
            match self.script_args(checks, group, "0", now, offset, Some(replies)) {
                Ok(args) => calls.push((group.iter().map(|&i| keys[i].clone()).collect(), args)),
                Err(_) => {
                    inner.refund_failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if calls.is_empty() {
            return;
        }
        inner.refunds.fetch_add(1, Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + inner.timeout;
        let refund = self.script(&scripts::REFUND);
        let results = join_all(
            calls
                .iter()
                .map(|(k, a): &(Vec<String>, Vec<Arg>)| inner.conn.eval(refund, k, a, deadline)),
        )
        .await;
        let failed = results.iter().filter(|r| r.is_err()).count() as u64;
        inner.refund_failures.fetch_add(failed, Ordering::Relaxed);
    }

    /// Check indices grouped by the slot their key falls in, in order of first appearance; one
    /// group for everything when not on a Cluster.
    fn groups(&self, keys: &[String]) -> Vec<Vec<usize>> {
        if !self.inner.cluster {
            return vec![(0..keys.len()).collect()];
        }
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let s = slot(k.as_bytes());
            match groups.iter_mut().find(|(g, _)| *g == s) {
                Some((_, members)) => members.push(i),
                None => groups.push((s, vec![i])),
            }
        }
        groups.into_iter().map(|(_, m)| m).collect()
    }

    async fn peek_one(&self, key: &str, policy: &Policy) -> StoreResult<Decision> {
        let offset = self.time_offset();
        let now = self.app_now(offset);
        let check = [Check::new(key, policy, 0)];
        let args = self.script_args(&check, &[0], "0", now, offset, None)?;
        let keys = [self.key_of(key)];
        let inner = &self.inner;
        let check = self.script(&scripts::CHECK);
        let value = match inner.conn.masters() {
            Some(masters) => {
                let call = [(&keys[..], args.as_slice())];
                let mut results = self
                    .eval_by_master(masters, check, &call, inner.timeout)
                    .await;
                results.pop().unwrap_or(Ok(redis::Value::Nil))?
            }
            None => {
                self.guarded_by(inner.timeout, |deadline| {
                    inner.conn.eval(check, &keys, &args, deadline)
                })
                .await?
            }
        };
        let mut replies = decode_replies(value, std::iter::once(policy.limit()))?;
        replies
            .pop()
            .map(|r| r.decision)
            .ok_or_else(|| StoreError::Rejected("the check script returned nothing".to_owned()))
    }

    async fn remove(&self, key: &str) -> StoreResult<bool> {
        self.delete(&self.key_of(key)).await
    }
}

impl Store for RedisStore {
    async fn check(&self, checks: &[Check<'_>]) -> StoreResult<Vec<Decision>> {
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        self.check_all(checks).await
    }

    async fn peek(&self, key: &str, policy: &Policy) -> StoreResult<Decision> {
        self.peek_one(key, policy).await
    }

    async fn reset(&self, key: &str) -> StoreResult<bool> {
        self.remove(key).await
    }

    async fn reserve(&self, checks: &[Check<'_>], lease: Lease<'_>) -> StoreResult<Vec<Decision>> {
        self.reserve_all(checks, lease).await
    }

    async fn settle(&self, id: &ReservationId, used: u64) -> StoreResult<Settlement> {
        self.settle_one(id, used).await
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> StoreResult<Vec<Decision>> {
        self.refund_now(refunds).await
    }

    fn shares_overrides(&self) -> bool {
        true
    }

    async fn put_override(&self, id: &str, body: &str) -> StoreResult<u64> {
        self.change_override(id, Some(body)).await
    }

    async fn remove_override(&self, id: &str) -> StoreResult<u64> {
        self.change_override(id, None).await
    }

    async fn override_version(&self) -> StoreResult<u64> {
        self.read_override_version().await
    }

    async fn overrides(&self) -> StoreResult<SharedOverrides> {
        self.read_overrides().await
    }

    /// See [`crate::supports`]: every Redis store holds the same policies.
    fn supports(&self, policy: &Policy) -> Result<(), UnsupportedPolicy> {
        crate::supports(policy)
    }
}

/// What [`Store::supports`] answers for any Redis store, without a connection: for tools that
/// check rules before any Redis is reachable, such as `sluice validate --store`.
///
/// Refuses an algorithm the algorithm table says the store does not hold, and a policy with a number that Lua's doubles cannot hold exactly: a count of 2⁵³ or
/// more, a window or period of about 104 days or more (417 days for a fixed window in whole
/// microseconds), or a GCRA or queue backlog that takes 104 days or more to drain. The reason
/// says which number, and what to do instead.
///
/// ```
/// use std::time::Duration;
/// use sluice_core::{Policy, SlidingLog};
///
/// let day = Duration::from_secs(86_400);
/// let month = Policy::from(SlidingLog::new(100, 30 * day).unwrap());
/// assert!(sluice_redis::supports(&month).is_ok());
/// let year = Policy::from(SlidingLog::new(100, 365 * day).unwrap());
/// let refused = sluice_redis::supports(&year).unwrap_err();
/// assert!(refused.reason.contains("longer than the redis store can hold"));
/// ```
pub fn supports(policy: &Policy) -> Result<(), UnsupportedPolicy> {
    let algorithm = policy.algorithm();
    algorithm.spec().stores.redis.check("redis", algorithm)?;
    check_exact(policy).map_err(|reason| UnsupportedPolicy {
        store: "redis",
        reason,
    })
}
