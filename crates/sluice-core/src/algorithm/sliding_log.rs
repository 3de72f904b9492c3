//! The sliding window log: the exact algorithm. It remembers when each admitted request arrived
//! and admits a new one only if fewer than `limit` units arrived in the last window.
//!
//! Only admitted requests are logged (a rejected one would otherwise keep its sender locked out).
//! The log is an [`ExpiringLog`] whose entries count for the window, which bounds its memory by
//! the limit (plus one entry per charge in the window).

use std::time::Duration;

use super::INSTEAD_OF_A_LARGE_LOG;
use super::expiring_log::{ExpiringLog, LogLimit};
use crate::Policy;
use crate::algorithm::PolicyParams;
use crate::algorithm::{Magnitude, Magnitudes, StoreParams};
use crate::clock::duration_nanos;
use crate::policy::{Algorithm, PolicyError, limit_at_most, nonzero_nanos};
use crate::{Decision, Timestamp};

/// Sliding log parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingLog {
    limit: u64,
    window: u64,
}

/// One key's log: its admitted requests' `(arrival, units)` pairs, oldest first.
pub type SlidingLogState = ExpiringLog;

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

    /// The log's bounds: `limit` units in the entries of the last window.
    fn log(&self) -> LogLimit {
        LogLimit {
            limit: self.limit,
            lifetime: self.window,
        }
    }

    /// Decides a request of `cost` against `state` at `now`, without changing it. Call
    /// [`SlidingLog::record`] to admit it when the decision allows.
    ///
    /// A cost of 0 asks whether one more request would pass. A refusal's `retry_after` is when
    /// enough of the oldest entries will have left the window to make room.
    pub fn decide(&self, state: &SlidingLogState, now: Timestamp, cost: u64) -> Decision {
        self.log().decide(state, now, cost)
    }

    /// Records an admitted request of `cost` at `now`, dropping entries that no longer count.
    pub fn record(&self, state: &mut SlidingLogState, now: Timestamp, cost: u64) {
        self.log().record(state, now, cost);
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
        self.log().refund(state, units, taken_at, now);
    }

    /// Takes `units` at `now` whatever the log holds, past the limit if need be: they are
    /// logged as an admission would be, so requests are refused until enough entries have left
    /// the window.
    pub fn charge(&self, state: &mut SlidingLogState, units: u64, now: Timestamp) {
        self.log().charge(state, units, now);
    }

    /// Drops entries that no longer count at `now`.
    pub fn forget_expired(&self, state: &mut SlidingLogState, now: Timestamp) {
        self.log().forget_expired(state, now);
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
    pub(crate) fn magnitudes(&self) -> Magnitudes {
        Magnitudes::of([Magnitude::Length("window", self.window())])
    }
}
