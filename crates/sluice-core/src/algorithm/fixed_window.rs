//! The fixed window: a counter per window of any length, reset when the window ends.
//!
//! Windows are either aligned to the clock (every key's minute starts on the minute; a daily
//! window can start at a chosen local midnight through a UTC offset) or start at a key's first
//! request. Both let up to twice the limit through across a window boundary: that is the price
//! of one counter per key, and the reason the sliding algorithms exist.

use std::time::Duration;

use super::divisor::Divisor;
use crate::Policy;
use crate::algorithm::PolicyParams;
use crate::algorithm::{Magnitude, Magnitudes, StoreParams};
use crate::clock::duration_nanos;
use crate::policy::{PolicyError, nonzero_nanos};
use crate::{Decision, Timestamp};

/// Where fixed windows begin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Alignment {
    /// Windows start at multiples of the window length after the Unix epoch, shifted so that they
    /// begin at local midnight (or the local top of the hour) for a zone `utc_offset_secs` east of
    /// UTC. An offset of 0 aligns on UTC.
    Clock {
        /// The zone's offset from UTC in seconds, positive east: `10800` for UTC+3.
        utc_offset_secs: i32,
    },
    /// Each key's window starts with its first request and lasts one window length.
    FirstRequest,
}

/// Fixed window parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FixedWindow {
    limit: u64,
    window: u64,
    alignment: Alignment,
    /// For clock alignment: how far a window start lies after a multiple of the window length
    /// since the epoch, in `[0, window)`.
    shift: u64,
    /// The window again, to divide by without a division instruction.
    window_div: Divisor,
}

/// The state of one fixed-window counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FixedWindowState {
    /// When the counted window began.
    pub start: Timestamp,
    /// Units admitted in that window.
    pub count: u64,
}

impl FixedWindow {
    /// Up to `limit` units per `window`, with windows placed by `alignment`.
    pub fn new(limit: u64, window: Duration, alignment: Alignment) -> Result<Self, PolicyError> {
        let window = nonzero_nanos(window, "window")?;
        let shift = match alignment {
            Alignment::Clock { utc_offset_secs } => {
                // A zone east of UTC reaches midnight earlier, so its windows start
                // `offset` before the UTC-aligned ones.
                let offset = i128::from(utc_offset_secs) * 1_000_000_000;
                u64::try_from((-offset).rem_euclid(i128::from(window))).unwrap_or(0)
            }
            Alignment::FirstRequest => 0,
        };
        Ok(FixedWindow {
            limit,
            window,
            alignment,
            shift,
            window_div: Divisor::new(window),
        })
    }

    /// The most units per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// Where windows begin.
    pub fn alignment(&self) -> Alignment {
        self.alignment
    }

    /// The start of the window that `now` falls in, for a key whose last window began at `last`.
    #[inline]
    pub fn window_start(&self, last: Timestamp, now: Timestamp) -> Timestamp {
        let now_n = now.as_nanos();
        match self.alignment {
            Alignment::Clock { .. } => {
                let Some(since) = now_n.checked_sub(self.shift) else {
                    return Timestamp::EPOCH;
                };
                Timestamp::from_nanos(since - self.window_div.rem(since) + self.shift)
            }
            Alignment::FirstRequest => {
                let last_n = last.as_nanos();
                if last_n != 0 && now_n < last_n.saturating_add(self.window) {
                    last
                } else {
                    now
                }
            }
        }
    }

    /// The state brought to the window `now` falls in: a new, empty window when the stored one
    /// has ended.
    #[inline(always)]
    fn current(&self, state: FixedWindowState, now: Timestamp) -> FixedWindowState {
        let start = self.window_start(state.start, now);
        // A clock that stepped back into an earlier window keeps counting the later one.
        if start <= state.start && state.count > 0 {
            state
        } else {
            FixedWindowState { start, count: 0 }
        }
    }

    /// Decides a request of `cost` against `state` at `now`. Returns the new state, which the
    /// caller stores only if the decision admits the request. A fresh key's state is the default.
    ///
    /// A cost of 0 asks whether one more request would pass, and consumes nothing.
    // Always inlined, as the token bucket's: see there.
    #[inline(always)]
    pub fn decide(
        &self,
        state: FixedWindowState,
        now: Timestamp,
        cost: u64,
    ) -> (FixedWindowState, Decision) {
        let current = self.current(state, now);
        let end = current.start.as_nanos().saturating_add(self.window);
        let to_end = Duration::from_nanos(end.saturating_sub(now.as_nanos()));
        let remaining = self.limit.saturating_sub(current.count);
        let need = cost.max(1);
        if need > self.limit {
            return (
                current,
                Decision::deny(self.limit, remaining, to_end, Decision::NEVER),
            );
        }
        if need > remaining {
            return (
                current,
                Decision::deny(self.limit, remaining, to_end, to_end),
            );
        }
        let after = FixedWindowState {
            start: current.start,
            count: current.count + cost,
        };
        let reset = if after.count == 0 {
            Duration::ZERO
        } else {
            to_end
        };
        (after, Decision::allow(self.limit, remaining - cost, reset))
    }

    /// Gives back `units` taken at `taken_at`, if the stored window is the one that took them.
    /// Once that window has ended its units are gone with it: giving them to a later window
    /// would let that window admit more than its limit. The count never goes below zero, so a
    /// refund never leaves more than the limit remaining. `now` is not needed: a stored window
    /// that has ended is replaced by the next decision whatever it holds.
    pub fn refund(
        &self,
        state: FixedWindowState,
        units: u64,
        taken_at: Timestamp,
        now: Timestamp,
    ) -> FixedWindowState {
        let _ = now;
        let end = state.start.as_nanos().saturating_add(self.window);
        if taken_at < state.start || taken_at.as_nanos() >= end {
            return state;
        }
        FixedWindowState {
            count: state.count.saturating_sub(units),
            ..state
        }
    }

    /// Takes `units` at `now` whatever the window holds, past the limit if need be: requests
    /// are refused until the window ends, when the excess goes with it.
    pub fn charge(&self, state: FixedWindowState, units: u64, now: Timestamp) -> FixedWindowState {
        let current = self.current(state, now);
        FixedWindowState {
            count: current.count.saturating_add(units),
            ..current
        }
    }
}

/// How the rest of Sluice builds and names this algorithm's policies: see the algorithm table.
impl FixedWindow {
    /// The requests per window, on windows aligned as `alignment` says (the UTC clock when
    /// absent).
    pub(crate) fn from_params(p: &PolicyParams) -> Result<Policy, PolicyError> {
        let alignment = p
            .alignment
            .unwrap_or(Alignment::Clock { utc_offset_secs: 0 });
        Ok(FixedWindow::new(p.requests, p.window, alignment)?.into())
    }

    /// The policy a readiness probe peeks at to see that a store answers: one unit a second
    /// from a key's first request, which every store holds.
    pub(crate) fn probe() -> FixedWindow {
        let window = 1_000_000_000;
        FixedWindow {
            limit: 1,
            window,
            alignment: Alignment::FirstRequest,
            shift: 0,
            window_div: Divisor::new(window),
        }
    }

    /// A limit in Envoy's rule format, as a per-request override gives one: `limit` per `unit`,
    /// on windows aligned on the UTC clock, as Envoy counts every limit.
    pub(crate) fn envoy(limit: u64, unit: Duration) -> Result<FixedWindow, PolicyError> {
        FixedWindow::new(limit, unit, Alignment::Clock { utc_offset_secs: 0 })
    }

    /// When this is a limit Envoy counts (windows aligned on the clock), the counter beside it
    /// on the same windows that holds up to `capacity`: where usage Envoy reports beyond the
    /// limit goes. `None` for windows that start at a key's first request.
    pub(crate) fn envoy_overflow(&self, capacity: u64) -> Option<FixedWindow> {
        match self.alignment {
            Alignment::Clock { .. } => Some(FixedWindow {
                limit: capacity,
                ..*self
            }),
            Alignment::FirstRequest => None,
        }
    }

    /// The values of the table's key fields: limit, window and alignment.
    pub(crate) fn key_values(&self) -> Vec<String> {
        vec![
            self.limit().to_string(),
            self.window().as_nanos().to_string(),
            match self.alignment() {
                Alignment::Clock { utc_offset_secs } => format!("clock{utc_offset_secs:+}"),
                Alignment::FirstRequest => "first_request".to_owned(),
            },
        ]
    }

    /// The store's parameters: limit, window (ns), 1 if clock-aligned, and for clock-aligned
    /// windows the start of the one `now` (the application's clock) falls in: any start on the
    /// grid places the windows, so a skewed clock moves nothing.
    pub(crate) fn store_params(&self, now: Timestamp) -> StoreParams {
        let (aligned, reference) = match self.alignment() {
            Alignment::Clock { .. } => (1, self.window_start(Timestamp::EPOCH, now)),
            Alignment::FirstRequest => (0, Timestamp::EPOCH),
        };
        [
            Some(self.limit()),
            Some(duration_nanos(self.window())),
            Some(aligned),
            Some(reference.as_nanos()),
        ]
    }

    /// The numbers a store must hold: the limit and the window.
    pub(crate) fn magnitudes(&self) -> Magnitudes {
        Magnitudes::of([
            Magnitude::Count("limit", self.limit()),
            Magnitude::LongWindow(self.window()),
        ])
    }
}
