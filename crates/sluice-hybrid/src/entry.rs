//! The bookkeeping of one key: its local state, the units it owes the global count, its place
//! in the negative cache, and the allowance this instance may still use before the next sync.

use std::sync::atomic::{AtomicU64, Ordering};

use sluice_core::{Decision, Policy, Timestamp};

use crate::local::{Local, add_units, decide, give_back, is_bucket, window_end};
use crate::sync::Floor;

/// One key's entry: its local state, and what it owes the global count.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) policy: Policy,
    pub(crate) state: Local,
    /// Units admitted here and not yet in Redis, by the end of the window they were counted in
    /// (for the bucket algorithms: one batch, by the time of its latest unit). At most two windows: the current one and, for the
    /// sliding counter, the one before.
    pub(crate) pending: Vec<(Timestamp, u64)>,
    /// The negative cache: until then, the key is known to refuse even one unit, and the sync
    /// leaves it alone unless it has units to push.
    pub(crate) quiet_until: Timestamp,
    /// When the counter is full again: after that, and with nothing pending, the entry can go.
    pub(crate) expires: Timestamp,
    /// Units this instance may still admit before the next sync: what its last sync was granted
    /// and reserved in Redis for it (or, for a key it has not synced yet, its share of the
    /// limit).
    pub(crate) allowance: u64,
    /// Until when the allowance may be used: its claim in Redis expires unless a sync renews it.
    pub(crate) allowance_until: Timestamp,
    /// Units asked of this key here since the last sync, admitted or not: what the instance
    /// keeps of its allowance while a sync is on its way.
    pub(crate) wanted: u64,
    /// When a sync must read the key, even if it was asked for nothing, to renew its claim
    /// before the allowance lapses.
    pub(crate) renew_at: Timestamp,
    /// The key's global state as the last successful sync found it, sent back with every sync
    /// as the floor Redis may not answer below (see `sync.lua`): kept through failed syncs, so
    /// that a Redis that comes back empty is given back what it held.
    pub(crate) known: Option<Floor>,
    /// Units sent by syncs that failed, which Redis may or may not have applied (a call that
    /// timed out may still run): each batch with the attempt that first sent it, by the end of
    /// its window as in `pending`. Sent again with that tag, which Redis compares with the last
    /// attempt of this instance it ran on the key, so that a batch is counted once.
    pub(crate) doubt: Vec<(u64, Timestamp, u64)>,
    /// Units given back here (a settled reservation, a refund) and not yet sent: each with the
    /// end of the window they were taken in (for the buckets: when they were given back) and
    /// when they were taken. Sent by the next sync as negative units, and laid again over the
    /// global state a sync brings back while they are on their way. Never sent twice: a sync
    /// that fails drops them, and the units stay counted.
    pub(crate) refunds: Vec<(Timestamp, u64, Timestamp)>,
}

/// A key is near its limit, and sent at every sync it has units to push, once this fraction
/// of its limit (one in four) is used.
const NEAR_LIMIT: u64 = 4;

/// The most batches in doubt a key keeps apart: beyond them, the oldest two are merged under
/// the newer tag, which may count the older again (more, never less).
const DOUBT_BATCHES: usize = 4;

impl Entry {
    pub(crate) fn add_pending(&mut self, end: Timestamp, units: u64, dropped: &AtomicU64) {
        if is_bucket(self.policy.algorithm()) {
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
    pub(crate) fn commit(
        &mut self,
        policy: &Policy,
        state: Local,
        cost: u64,
        d: Decision,
        now: Timestamp,
        dropped: &AtomicU64,
    ) {
        let end = if is_bucket(policy.algorithm()) {
            now
        } else {
            window_end(policy, &state)
        };
        self.state = state;
        self.allowance = self.allowance.saturating_sub(cost);
        self.add_pending(end, cost, dropped);
        self.expires = self.expires.max(now.saturating_add(d.reset_after));
    }

    /// Counts `cost` units admitted at `now` beyond this store's decision (by a rule's
    /// `on_store_error` while Redis was away): laid on the local state whatever the limit says,
    /// and owed to the global count like any admitted unit. The allowance is left alone: these
    /// units were not the store's to admit.
    pub(crate) fn admit_anyway(&mut self, cost: u64, now: Timestamp, dropped: &AtomicU64) {
        // The state as of now (a window that ended rolls over), without consuming.
        let Some((mut state, _)) = decide(&self.policy, Some(&self.state), now, 0) else {
            return;
        };
        let end = if is_bucket(self.policy.algorithm()) {
            now
        } else {
            window_end(&self.policy, &state)
        };
        add_units(&self.policy, &mut state, end, cost, now);
        self.state = state;
        self.add_pending(end, cost, dropped);
        if let Some((_, d)) = decide(&self.policy, Some(&state), now, 0) {
            self.expires = self.expires.max(now.saturating_add(d.reset_after));
        }
    }

    /// Gives back `units` taken at `taken_at`, in the window ending at `end` (for a bucket: any
    /// time), at `now`: on the local state at once, and to the global count with the next sync.
    pub(crate) fn give_back(
        &mut self,
        units: u64,
        end: Timestamp,
        taken_at: Timestamp,
        now: Timestamp,
    ) {
        if units == 0 {
            return;
        }
        give_back(&self.policy, &mut self.state, units, taken_at, now);
        let end = if is_bucket(self.policy.algorithm()) {
            now
        } else {
            end
        };
        self.refunds.push((end, units, taken_at));
    }

    /// Keeps `units` of the window ending at `end` that attempt `tag` first sent and that a
    /// failed sync leaves in doubt.
    pub(crate) fn add_doubt(&mut self, tag: u64, end: Timestamp, units: u64) {
        match self
            .doubt
            .iter_mut()
            .find(|(t, e, _)| *t == tag && *e == end)
        {
            Some((_, _, u)) => *u = u.saturating_add(units),
            None => self.doubt.push((tag, end, units)),
        }
        if self.doubt.len() > DOUBT_BATCHES {
            self.doubt.sort_by_key(|(t, _, _)| *t);
            let (_, end, units) = self.doubt.remove(0);
            let (newer, _, _) = self.doubt[0];
            self.doubt.push((newer, end, units));
        }
    }

    /// Whether the entry can go: nothing left to push or give back, and its counter full again.
    pub(crate) fn spent(&self, now: Timestamp) -> bool {
        self.pending.is_empty()
            && self.doubt.is_empty()
            && self.refunds.is_empty()
            && self.expires <= now
    }

    /// Whether the entry can go with its pending units unsent, because they no longer weigh on
    /// anything: its counter is full again by `now`, with them on it. For a window that means
    /// its window has ended, and Redis would drop them anyway (see `sync.lua`). For a bucket it
    /// means they have refilled, which the state of a lone instance knows exactly; among several
    /// instances the state lacks what the others admitted since the last sync, over which the
    /// units would still lie in Redis, so a bucket's units are sent then.
    pub(crate) fn outlived(&self, now: Timestamp, alone: bool) -> bool {
        self.doubt.is_empty()
            && self.expires <= now
            && (alone || !is_bucket(self.policy.algorithm()))
    }

    /// Whether the sync at `now` must send this key, which has units to push or was asked for
    /// since its last sync: the rule that lets a cold key's units wait (`docs/hybrid-store.md`,
    /// "Which keys a sync sends"). A key is sent when any of these holds:
    ///
    /// - it has units in doubt, which are retried at every sync;
    /// - this instance has never synced it: among several instances it is admitting on an
    ///   unreserved first share, which only a sync turns into a claim;
    /// - its renewal is due (`renew_at`): among several instances, its claim in Redis must be
    ///   renewed, with its units pushed, before it expires; alone, its units wait at most a
    ///   claim's time to live;
    /// - among several instances, its allowance is short: less than twice what it was asked
    ///   for since its last sync, so that it could run out before the next;
    /// - it is near its limit: a quarter of it or more is used, as far as this instance knows,
    ///   so the other instances' usage matters to its decisions.
    ///
    /// Otherwise its units wait. That keeps the bound: every unit an instance admits among
    /// several is inside its claim, which every other instance's grant sets aside whether or
    /// not the unit has been pushed, and the claim outlives the wait (renewal comes at a quarter
    /// of its time to live).
    pub(crate) fn due(&self, now: Timestamp, alone: bool) -> bool {
        if !self.doubt.is_empty()
            || !self.refunds.is_empty()
            || self.known.is_none()
            || now >= self.renew_at
        {
            return true;
        }
        if !alone && self.allowance_at(now) < self.wanted.saturating_mul(2) {
            return true;
        }
        let limit = self.policy.limit();
        decide(&self.policy, Some(&self.state), now, 0).is_some_and(|(_, d)| {
            limit.saturating_sub(d.remaining).saturating_mul(NEAR_LIMIT) >= limit
        })
    }

    /// Units not yet known to be in Redis: pending, and in doubt.
    pub(crate) fn pending_units(&self) -> u64 {
        let doubt: u64 = self.doubt.iter().map(|(_, _, u)| u).sum();
        self.pending.iter().map(|(_, u)| u).sum::<u64>() + doubt
    }

    /// What may still be admitted here at `now` before the next sync.
    pub(crate) fn allowance_at(&self, now: Timestamp) -> u64 {
        if now < self.allowance_until {
            self.allowance
        } else {
            0
        }
    }

    /// A new entry, with the share of a key not synced yet.
    pub(crate) fn new(policy: &Policy, state: Local, expires: Timestamp, share: u64) -> Entry {
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
            known: None,
            doubt: Vec::new(),
            refunds: Vec::new(),
        }
    }
}
