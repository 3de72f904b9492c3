//! The sliding window log: the exact algorithm. It remembers when each admitted request arrived
//! and admits a new one only if fewer than `limit` units arrived in the last window.
//!
//! Only admitted requests are logged (a rejected one would otherwise keep its sender locked out),
//! and requests that arrive at the same instant share one entry, so a log never holds more than
//! `limit` entries: its memory is bounded by the limit. A charge (usage settled beyond what was
//! reserved) adds one entry more, so with charges the bound is `limit` plus one per charge in the
//! window.

use std::collections::VecDeque;
use std::time::Duration;

use super::INSTEAD_OF_A_LARGE_LOG;
use crate::Policy;
use crate::algorithm::PolicyParams;
use crate::algorithm::{Magnitude, StoreParams};
use crate::clock::duration_nanos;
use crate::policy::{Algorithm, PolicyError, limit_at_most, nonzero_nanos};
use crate::{Decision, Timestamp};

/// Sliding log parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingLog {
    limit: u64,
    window: u64,
}

/// One key's log: `(arrival, units)` pairs, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlidingLogState {
    entries: VecDeque<(Timestamp, u64)>,
    /// The units of every entry, kept so that a decision need not sum the whole log.
    total: u64,
}

impl SlidingLog {
    /// The largest limit a log takes. Each admitted request may cost an entry of 16 bytes, so a
    /// larger limit is better served by the sliding counter, which is constant-size.
    pub const MAX_LIMIT: u64 = 1_000_000;

    /// Up to `limit` units in any window of length `window`.
    pub fn new(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        let window = nonzero_nanos(window, "window")?;
        limit_at_most(
            limit,
            Self::MAX_LIMIT,
            Algorithm::SlidingLog,
            INSTEAD_OF_A_LARGE_LOG,
        )?;
        Ok(SlidingLog { limit, window })
    }

    /// The most units in any window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// Whether an entry that arrived at `at` still counts at `now`.
    fn live(&self, at: Timestamp, now: Timestamp) -> bool {
        at.as_nanos().saturating_add(self.window) > now.as_nanos()
    }

    /// Time from `now` until the entry that arrived at `at` stops counting.
    fn expiry(&self, at: Timestamp, now: Timestamp) -> Duration {
        let end = at.as_nanos().saturating_add(self.window);
        Duration::from_nanos(end.saturating_sub(now.as_nanos()))
    }

    /// Decides a request of `cost` against `state` at `now`, without changing it. Call
    /// [`SlidingLog::record`] to admit it when the decision allows.
    ///
    /// A cost of 0 asks whether one more request would pass.
    pub fn decide(&self, state: &SlidingLogState, now: Timestamp, cost: u64) -> Decision {
        // Entries are in arrival order, so the expired ones are a prefix: subtract only those.
        let expired = state
            .entries
            .iter()
            .take_while(|(at, _)| !self.live(*at, now));
        let used = state.total - expired.clone().map(|(_, n)| n).sum::<u64>();
        let live = state.entries.iter().skip(expired.count());
        let remaining = self.limit.saturating_sub(used);
        let need = cost.max(1);
        let last_expiry = |extra: bool| match state.entries.back() {
            _ if extra => self.window(),
            Some((at, _)) if self.live(*at, now) => self.expiry(*at, now),
            _ => Duration::ZERO,
        };
        if need > self.limit {
            return Decision::deny(self.limit, remaining, last_expiry(false), Decision::NEVER);
        }
        if need <= remaining {
            return Decision::allow(self.limit, remaining - cost, last_expiry(cost > 0));
        }
        // Wait until enough of the oldest entries expire to make room. A charge may have taken
        // the log past its limit, so room is what is left of `used`, not `remaining` plus it.
        let mut freed = 0;
        let mut retry = Duration::ZERO;
        for (at, units) in live {
            freed += units;
            retry = self.expiry(*at, now);
            if (used - freed).saturating_add(need) <= self.limit {
                break;
            }
        }
        Decision::deny(self.limit, remaining, last_expiry(false), retry)
    }

    /// Records an admitted request of `cost` at `now`, dropping entries that no longer count.
    pub fn record(&self, state: &mut SlidingLogState, now: Timestamp, cost: u64) {
        self.forget_expired(state, now);
        if cost == 0 {
            return;
        }
        match state.entries.back_mut() {
            Some((at, units)) if *at >= now => *units += cost,
            _ => state.entries.push_back((now, cost)),
        }
        state.total += cost;
    }

    /// Gives back up to `units` taken at `taken_at`: removes them from the newest entries
    /// logged at or before `taken_at` that still count at `now`, newest first. Entries that
    /// have left the window give nothing back: their units no longer count, and crediting them
    /// to later entries would let the window admit more than its limit. Entries after
    /// `taken_at` were admitted for other requests, so they are left alone.
    pub fn refund(
        &self,
        state: &mut SlidingLogState,
        units: u64,
        taken_at: Timestamp,
        now: Timestamp,
    ) {
        self.forget_expired(state, now);
        let mut left = units;
        let mut i = state.entries.len();
        while left > 0 && i > 0 {
            i -= 1;
            let Some((at, held)) = state.entries.get_mut(i) else {
                break;
            };
            if *at > taken_at {
                continue;
            }
            let back = left.min(*held);
            *held -= back;
            left -= back;
            state.total -= back;
            if *held == 0 {
                state.entries.remove(i);
            }
        }
    }

    /// Takes `units` at `now` whatever the log holds, past the limit if need be: they are
    /// logged as an admission would be, so requests are refused until enough entries have left
    /// the window. The total is held at `u64::MAX`, far past any limit, so that it cannot
    /// overflow.
    pub fn charge(&self, state: &mut SlidingLogState, units: u64, now: Timestamp) {
        self.record(state, now, units.min(u64::MAX - state.total));
    }

    /// Drops entries that no longer count at `now`.
    pub fn forget_expired(&self, state: &mut SlidingLogState, now: Timestamp) {
        while let Some((at, _)) = state.entries.front() {
            if self.live(*at, now) {
                break;
            }
            if let Some((_, units)) = state.entries.pop_front() {
                state.total -= units;
            }
        }
    }
}

impl SlidingLogState {
    /// How many entries the log holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the log holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// How the rest of Sluice builds and names this algorithm's policies: see the algorithm table.
impl SlidingLog {
    /// The requests per window.
    pub(crate) fn from_params(p: &PolicyParams) -> Result<Policy, PolicyError> {
        Ok(SlidingLog::new(p.requests, p.window)?.into())
    }

    /// The values of the table's key fields: limit and window.
    pub(crate) fn key_values(&self) -> Vec<String> {
        vec![
            self.limit().to_string(),
            self.window().as_nanos().to_string(),
        ]
    }

    /// The store's parameters: limit and window (ns).
    pub(crate) fn store_params(&self, _now: Timestamp) -> StoreParams {
        [
            Some(self.limit()),
            Some(duration_nanos(self.window())),
            None,
            None,
        ]
    }

    /// The numbers a store must hold: the window (the limit is bounded far lower already).
    pub(crate) fn magnitudes(&self) -> Vec<Magnitude> {
        vec![Magnitude::Length("window", self.window())]
    }
}
