//! The sliding window counter: two fixed-window counters blended into an estimate of the last
//! window, as Cloudflare describes it:
//!
//! ```text
//! estimate = previous · (window − elapsed) / window + current
//! ```
//!
//! where `elapsed` is how far `now` lies into the current clock-aligned window. The weighted
//! previous count is rounded down, as in the classic worked example (6.5 counts as 6). The
//! estimate assumes the previous window's requests were spread evenly; `docs/` publishes how far
//! it strays from the exact log.

use std::time::Duration;

use super::divisor::Divisor;
use crate::Policy;
use crate::algorithm::PolicyParams;
use crate::algorithm::{Magnitude, Magnitudes, StoreParams};
use crate::clock::duration_nanos;
use crate::policy::{Algorithm, PolicyError, limit_at_most, nonzero_nanos};
use crate::{Decision, Timestamp};

/// What to use instead of a sliding log whose limit is too large for its memory: the sliding
/// counter, which keeps two counters whatever the limit.
pub(super) const INSTEAD_OF_A_LARGE_LOG: &str =
    "use sliding_counter, whose memory does not grow with the limit";

/// Sliding counter parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingCounter {
    limit: u64,
    window: u64,
    /// The window again, to divide by without a division instruction.
    window_div: Divisor,
}

/// The two counters of one key. Counts are `u32` to keep a tracked key small; the policy's limit
/// is bounded to match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlidingCounterState {
    /// The start of the current window.
    pub start: Timestamp,
    /// Units admitted in the current window.
    pub current: u32,
    /// Units admitted in the window before it.
    pub previous: u32,
}

impl SlidingCounter {
    /// The largest limit, bounded by the width of the stored counters.
    pub const MAX_LIMIT: u64 = u32::MAX as u64;

    /// Up to `limit` units in any window of length `window`, estimated.
    pub fn new(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        let window = nonzero_nanos(window, "window")?;
        limit_at_most(
            limit,
            Self::MAX_LIMIT,
            Algorithm::SlidingCounter,
            "use a fixed window, or a longer window with a proportionally larger limit",
        )?;
        Ok(SlidingCounter {
            limit,
            window,
            window_div: Divisor::new(window),
        })
    }

    /// The most units in any window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// The state moved to the window `now` falls in: the current count becomes the previous one
    /// when one window has passed, and both are forgotten after two.
    #[inline]
    fn roll(&self, s: SlidingCounterState, now: Timestamp) -> SlidingCounterState {
        let now_n = now.as_nanos();
        let start = now_n - self.window_div.rem(now_n);
        let last = s.start.as_nanos();
        if start <= last {
            // The same window, or a clock that stepped back: keep counting the later window.
            return s;
        }
        let previous = if start - last == self.window {
            s.current
        } else {
            0
        };
        SlidingCounterState {
            start: Timestamp::from_nanos(start),
            current: 0,
            previous,
        }
    }

    /// The previous window's count weighted by its overlap with the sliding window, rounded down.
    #[inline]
    fn weighted_previous(&self, previous: u32, elapsed: u64) -> u64 {
        let overlap = self.window - elapsed.min(self.window);
        self.window_div.mul_div_floor(u64::from(previous), overlap)
    }

    /// The estimated units in the window ending at `now`.
    pub fn estimate(&self, state: SlidingCounterState, now: Timestamp) -> u64 {
        let s = self.roll(state, now);
        let elapsed = now.as_nanos().saturating_sub(s.start.as_nanos());
        self.weighted_previous(s.previous, elapsed) + u64::from(s.current)
    }

    /// Time from `now` (at `elapsed` into the window starting `s.start`) until the estimate has
    /// room for `need` units.
    fn retry_after(&self, s: SlidingCounterState, elapsed: u64, need: u64) -> Duration {
        // The first offset into a window with `previous` weighted so that at most `room` remains.
        let first_fit = |previous: u32, room: u64| -> Option<u64> {
            if previous == 0 {
                return Some(0);
            }
            // floor(previous·(W−e)/W) ≤ room  ⇔  previous·(W−e) < (room+1)·W
            let bound = crate::arith::mul_div_ceil(room + 1, self.window, u64::from(previous));
            Some((self.window + 1).saturating_sub(bound)).filter(|e| *e < self.window)
        };
        let current = u64::from(s.current);
        let to_next = self.window - elapsed;
        if current + need <= self.limit {
            if let Some(e) = first_fit(s.previous, self.limit - need - current) {
                return Duration::from_nanos(e.saturating_sub(elapsed));
            }
        }
        // In the next window, this window's count becomes the previous one.
        let e = first_fit(s.current, self.limit - need).unwrap_or(self.window);
        Duration::from_nanos(to_next + e)
    }

    /// Time from `now` until both counters no longer weigh on the estimate.
    #[inline]
    fn reset_after(&self, s: SlidingCounterState, elapsed: u64) -> Duration {
        let to_next = self.window - elapsed;
        Duration::from_nanos(match (s.current, s.previous) {
            (0, 0) => 0,
            (0, _) => to_next,
            _ => to_next + self.window,
        })
    }

    /// Decides a request of `cost` against `state` at `now`. Returns the new state, which the
    /// caller stores only if the decision admits the request. A fresh key's state is the default.
    ///
    /// A cost of 0 asks whether one more request would pass, and consumes nothing.
    // Always inlined, as the token bucket's: see there.
    #[inline(always)]
    pub fn decide(
        &self,
        state: SlidingCounterState,
        now: Timestamp,
        cost: u64,
    ) -> (SlidingCounterState, Decision) {
        let s = self.roll(state, now);
        let elapsed = now
            .as_nanos()
            .saturating_sub(s.start.as_nanos())
            .min(self.window - 1);
        let estimate = self.weighted_previous(s.previous, elapsed) + u64::from(s.current);
        let remaining = self.limit.saturating_sub(estimate);
        let reset = self.reset_after(s, elapsed);
        let need = cost.max(1);
        if need > self.limit {
            return (
                s,
                Decision::deny(self.limit, remaining, reset, Decision::NEVER),
            );
        }
        if need > remaining {
            let retry = self.retry_after(s, elapsed, need);
            return (s, Decision::deny(self.limit, remaining, reset, retry));
        }
        // `estimate + cost <= limit <= u32::MAX`, so the new count fits.
        let after = SlidingCounterState {
            current: s.current + cost as u32,
            ..s
        };
        let reset = self.reset_after(after, elapsed);
        (after, Decision::allow(self.limit, remaining - cost, reset))
    }

    /// Gives back `units` taken at `taken_at`: from the current window's count if they were
    /// taken in it, from the previous window's if they were taken in that one (it still weighs
    /// on the estimate), and not at all if they were taken earlier, since those units no longer
    /// count and giving them to a later window would let it admit more than its limit. Counts
    /// never go below zero, so a refund never leaves more than the limit remaining.
    pub fn refund(
        &self,
        state: SlidingCounterState,
        units: u64,
        taken_at: Timestamp,
        now: Timestamp,
    ) -> SlidingCounterState {
        let mut s = self.roll(state, now);
        let units = u32::try_from(units).unwrap_or(u32::MAX);
        let start = s.start.as_nanos();
        let at = taken_at.as_nanos();
        if at >= start && at - start < self.window {
            s.current = s.current.saturating_sub(units);
        } else if at < start && start - at <= self.window {
            s.previous = s.previous.saturating_sub(units);
        }
        s
    }

    /// Takes `units` at `now` whatever the estimate, past the limit if need be: the current
    /// count takes them, so requests are refused until they have weighed down enough as the
    /// window slides past, as any units admitted at `now` would.
    pub fn charge(
        &self,
        state: SlidingCounterState,
        units: u64,
        now: Timestamp,
    ) -> SlidingCounterState {
        let mut s = self.roll(state, now);
        let units = u32::try_from(units).unwrap_or(u32::MAX);
        s.current = s.current.saturating_add(units);
        s
    }
}

/// How the rest of Sluice builds and names this algorithm's policies: see the algorithm table.
impl SlidingCounter {
    /// The requests per window.
    pub(crate) fn from_params(p: &PolicyParams) -> Result<Policy, PolicyError> {
        Ok(SlidingCounter::new(p.requests, p.window)?.into())
    }

    /// The values of the table's key fields: limit and window.
    pub(crate) fn key_values(&self) -> Vec<String> {
        vec![
            self.limit().to_string(),
            self.window().as_nanos().to_string(),
        ]
    }

    /// The store's parameters: limit, window (ns), and the start of the window `now` (the
    /// application's clock) falls in, on the grid.
    pub(crate) fn store_params(&self, now: Timestamp) -> StoreParams {
        let window = duration_nanos(self.window()).max(1);
        let n = now.as_nanos();
        [Some(self.limit()), Some(window), None, Some(n - n % window)]
    }

    /// The numbers a store must hold: the window (the limit is bounded far lower already).
    pub(crate) fn magnitudes(&self) -> Magnitudes {
        Magnitudes::of([Magnitude::Length("window", self.window())])
    }
}
