//! The bucketed sliding window: the window split into `sub_windows` equal buckets, one small
//! counter each. A request is admitted if the buckets still in the window (the current one and
//! the `sub_windows − 1` before it) hold fewer than `limit` units with it.
//!
//! Memory is bounded by the number of buckets, not by the limit (as the log's is) nor by traffic:
//! an hour split into 60 minutes is 60 counters per key whatever the rate. The price is
//! granularity: a bucket's units all leave the window together when the bucket does. Within any
//! window that starts on a bucket boundary it never admits more than `limit`; over an arbitrary
//! stretch of one window length it can exceed it by at most what one bucket admitted.

use std::time::Duration;

use crate::Policy;
use crate::algorithm::{DEFAULT_SUB_WINDOWS, PolicyParams};
use crate::algorithm::{Magnitude, Magnitudes, StoreParams};
use crate::clock::duration_nanos;
use crate::policy::{Algorithm, PolicyError, limit_at_most, nonzero_nanos};
use crate::{Decision, Timestamp};

/// Bucketed sliding window parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BucketedWindow {
    limit: u64,
    /// The bucket length in nanoseconds: the window divided by `sub_windows`.
    bucket: u64,
    sub_windows: u32,
}

/// One key's buckets: a ring of counts, with the index (since the epoch, in bucket lengths) of
/// the newest bucket it holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BucketedWindowState {
    newest: u64,
    /// `counts[i % sub_windows]` is bucket `i`'s count for the live `i`; empty until the first
    /// admitted request.
    counts: Box<[u32]>,
}

impl BucketedWindowState {
    /// Units held in each live bucket, oldest first, for a window of `sub_windows` ending at
    /// the bucket `newest`: what the Redis script and the tests compare.
    pub fn buckets(&self) -> (u64, Vec<u32>) {
        let n = self.counts.len() as u64;
        let counts = (0..n)
            .map(|k| {
                let index = (self.newest % n.max(1) + 1 + k) % n.max(1);
                self.counts[index as usize]
            })
            .collect();
        (self.newest, counts)
    }
}

impl BucketedWindow {
    /// The most buckets a window may be split into: 4 KiB of counters per key at most.
    pub const MAX_SUB_WINDOWS: u32 = 1024;

    /// The largest limit: a bucket's counter is a `u32`.
    pub const MAX_LIMIT: u64 = u32::MAX as u64;

    /// Up to `limit` units in any `window` that starts on a bucket boundary, the window split
    /// into `sub_windows` buckets. The window must divide into whole nanoseconds per bucket.
    pub fn new(limit: u64, window: Duration, sub_windows: u32) -> Result<Self, PolicyError> {
        let window = nonzero_nanos(window, "window")?;
        limit_at_most(
            limit,
            Self::MAX_LIMIT,
            Algorithm::BucketedWindow,
            "use a longer window with a proportionally larger limit",
        )?;
        if sub_windows == 0 || sub_windows > Self::MAX_SUB_WINDOWS {
            return Err(PolicyError::SubWindows {
                sub_windows,
                max: Self::MAX_SUB_WINDOWS,
            });
        }
        if window % u64::from(sub_windows) != 0 {
            return Err(PolicyError::UnevenSubWindows {
                window: Duration::from_nanos(window),
                sub_windows,
            });
        }
        Ok(BucketedWindow {
            limit,
            bucket: window / u64::from(sub_windows),
            sub_windows,
        })
    }

    /// The limit per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.bucket * u64::from(self.sub_windows))
    }

    /// How many buckets the window is split into.
    pub fn sub_windows(&self) -> u32 {
        self.sub_windows
    }

    /// The length of one bucket.
    pub fn bucket(&self) -> Duration {
        Duration::from_nanos(self.bucket)
    }

    /// The index of the bucket `now` falls in; a clock behind the state's newest bucket counts
    /// as that bucket (no time passing).
    fn current(&self, state: &BucketedWindowState, now: Timestamp) -> u64 {
        (now.as_nanos() / self.bucket).max(state.newest)
    }

    /// The count of bucket `index` if it is live in a window whose newest bucket is `current`.
    /// A state of another split (a policy changed under a key) counts as empty, as
    /// [`BucketedWindow::record`] then starts it anew.
    fn count(&self, state: &BucketedWindowState, current: u64, index: u64) -> u64 {
        let n = u64::from(self.sub_windows);
        if state.counts.len() as u64 != n
            || index > state.newest
            || index.saturating_add(n) <= current
        {
            return 0;
        }
        u64::from(state.counts[(index % n) as usize])
    }

    /// Time from `now` until bucket `index` leaves the window.
    fn leaves(&self, index: u64, now: Timestamp) -> Duration {
        let at = index
            .saturating_add(u64::from(self.sub_windows))
            .saturating_mul(self.bucket);
        Duration::from_nanos(at.saturating_sub(now.as_nanos()))
    }

    /// Decides a request of `cost` against `state` at `now`, without changing it. Call
    /// [`BucketedWindow::record`] to admit it when the decision allows.
    ///
    /// A cost of 0 asks whether one more request would pass.
    pub fn decide(&self, state: &BucketedWindowState, now: Timestamp, cost: u64) -> Decision {
        let current = self.current(state, now);
        let n = u64::from(self.sub_windows);
        let first = current.saturating_sub(n - 1);
        let used: u64 = (first..=current)
            .map(|i| self.count(state, current, i))
            .sum();
        let remaining = self.limit.saturating_sub(used);
        // The newest bucket holding anything is the last to leave.
        let reset = |extra: bool| {
            if extra {
                return self.leaves(current, now);
            }
            (first..=current)
                .rev()
                .find(|&i| self.count(state, current, i) > 0)
                .map_or(Duration::ZERO, |i| self.leaves(i, now))
        };
        let need = cost.max(1);
        if need > self.limit {
            return Decision::deny(self.limit, remaining, reset(false), Decision::NEVER);
        }
        if need <= remaining {
            return Decision::allow(self.limit, remaining - cost, reset(cost > 0));
        }
        // Wait until enough of the oldest buckets leave to make room. A charge may have taken
        // the window past its limit, so room is what is left of `used`, not `remaining` plus it.
        let mut freed = 0;
        let mut retry = self.leaves(current, now);
        for i in first..=current {
            freed += self.count(state, current, i);
            if (used - freed).saturating_add(need) <= self.limit {
                retry = self.leaves(i, now);
                break;
            }
        }
        Decision::deny(self.limit, remaining, reset(false), retry)
    }

    /// Records an admitted request of `cost` at `now`: clears the buckets that left the window
    /// and adds `cost` to the current one.
    pub fn record(&self, state: &mut BucketedWindowState, now: Timestamp, cost: u64) {
        let n = u64::from(self.sub_windows);
        if state.counts.len() as u64 != n {
            *state = BucketedWindowState {
                newest: 0,
                counts: vec![0; n as usize].into_boxed_slice(),
            };
        }
        let current = self.current(state, now);
        if current > state.newest {
            // Buckets newest+1..=current are new: clear what they held a lap ago.
            let fresh = (current - state.newest).min(n);
            for k in 0..fresh {
                state.counts[((current - k) % n) as usize] = 0;
            }
            state.newest = current;
        }
        let slot = &mut state.counts[(current % n) as usize];
        // An admission keeps the window within `limit ≤ u32::MAX`; a charge may go past it,
        // and the bucket then holds `u32::MAX` at most.
        *slot = u32::try_from(u64::from(*slot).saturating_add(cost)).unwrap_or(u32::MAX);
    }

    /// Gives back `units` taken at `taken_at` to the bucket that holds that instant, while the
    /// bucket is still in the window. A bucket that has left gives nothing back: its units no
    /// longer count, and crediting them to a later bucket would let the window admit more than
    /// its limit. The count never goes below zero, so a refund never leaves more than the
    /// limit remaining.
    pub fn refund(
        &self,
        state: &mut BucketedWindowState,
        units: u64,
        taken_at: Timestamp,
        now: Timestamp,
    ) {
        let current = self.current(state, now);
        let index = taken_at.as_nanos() / self.bucket;
        if self.count(state, current, index) == 0 {
            // Not in the window, of another split, or holding nothing to give back.
            return;
        }
        let n = u64::from(self.sub_windows);
        let units = u32::try_from(units).unwrap_or(u32::MAX);
        if let Some(slot) = state.counts.get_mut((index % n) as usize) {
            *slot = slot.saturating_sub(units);
        }
    }

    /// Takes `units` at `now` whatever the window holds, past the limit if need be: the current
    /// bucket takes them as an admission would, so requests are refused until that bucket
    /// leaves the window. A bucket holds at most `u32::MAX`, far past any limit.
    pub fn charge(&self, state: &mut BucketedWindowState, units: u64, now: Timestamp) {
        self.record(state, now, units);
    }
}

/// How the rest of Sluice builds and names this algorithm's policies: see the algorithm table.
impl BucketedWindow {
    /// The requests per window, split into `sub_windows` buckets
    /// ([`DEFAULT_SUB_WINDOWS`](crate::algorithm::DEFAULT_SUB_WINDOWS) when absent).
    pub(crate) fn from_params(p: &PolicyParams) -> Result<Policy, PolicyError> {
        let sub_windows = p.sub_windows.unwrap_or(DEFAULT_SUB_WINDOWS);
        Ok(BucketedWindow::new(p.requests, p.window, sub_windows)?.into())
    }

    /// The values of the table's key fields: limit, window and sub-windows.
    pub(crate) fn key_values(&self) -> Vec<String> {
        vec![
            self.limit().to_string(),
            self.window().as_nanos().to_string(),
            self.sub_windows().to_string(),
        ]
    }

    /// The store's parameters: limit, bucket length (ns), buckets in the window, and the start of
    /// the bucket `now` (the application's clock) falls in, on the grid.
    pub(crate) fn store_params(&self, now: Timestamp) -> StoreParams {
        let bucket = duration_nanos(self.bucket()).max(1);
        let n = now.as_nanos();
        [
            Some(self.limit()),
            Some(bucket),
            Some(u64::from(self.sub_windows())),
            Some(n - n % bucket),
        ]
    }

    /// The numbers a store must hold: the window (the limit is at most `u32::MAX`, and the
    /// buckets' starts lie within the window of now).
    pub(crate) fn magnitudes(&self) -> Magnitudes {
        Magnitudes::of([Magnitude::Length("window", self.window())])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn at(secs: u64) -> Timestamp {
        Timestamp::from_secs(secs)
    }

    /// Decides and records like a store would.
    fn hit(p: &BucketedWindow, s: &mut BucketedWindowState, secs: u64) -> Decision {
        let d = p.decide(s, at(secs), 1);
        if d.allowed {
            p.record(s, at(secs), 1);
        }
        d
    }

    #[test]
    fn an_hour_in_minutes_frees_each_minute_as_it_leaves() {
        // 3 an hour, hour split into 60 one-minute buckets.
        let p = BucketedWindow::new(3, 60 * MINUTE, 60).unwrap();
        let mut s = BucketedWindowState::default();
        assert!(hit(&p, &mut s, 0).allowed);
        assert!(hit(&p, &mut s, 600).allowed);
        assert!(hit(&p, &mut s, 1200).allowed);
        let refused = hit(&p, &mut s, 1800);
        assert!(!refused.allowed);
        // The first request's minute leaves the window at 60 minutes.
        assert_eq!(refused.retry_after, Duration::from_secs(3600 - 1800));
        // The last request's minute (20) leaves at 80 minutes.
        assert_eq!(refused.reset_after, Duration::from_secs(4800 - 1800));
        assert!(!hit(&p, &mut s, 3599).allowed);
        assert!(hit(&p, &mut s, 3600).allowed);
        assert!(!hit(&p, &mut s, 3601).allowed);
    }

    #[test]
    fn a_bucket_leaves_whole() {
        // 2 a minute in 2 buckets of 30 s: both requests in the first bucket leave at 60 s.
        let p = BucketedWindow::new(2, MINUTE, 2).unwrap();
        let mut s = BucketedWindowState::default();
        assert!(hit(&p, &mut s, 1).allowed);
        assert!(hit(&p, &mut s, 29).allowed);
        assert!(!hit(&p, &mut s, 59).allowed);
        assert!(hit(&p, &mut s, 60).allowed);
        assert!(hit(&p, &mut s, 61).allowed);
        assert_eq!(s.buckets(), (2, vec![0, 2]));
    }

    #[test]
    fn a_long_silence_clears_every_bucket() {
        let p = BucketedWindow::new(2, MINUTE, 6).unwrap();
        let mut s = BucketedWindowState::default();
        assert!(hit(&p, &mut s, 0).allowed);
        assert!(hit(&p, &mut s, 55).allowed);
        assert!(!hit(&p, &mut s, 56).allowed);
        let d = hit(&p, &mut s, 10_000);
        assert!(d.allowed);
        assert_eq!(d.remaining, 1);
        assert_eq!(s.buckets().1.iter().map(|&c| u64::from(c)).sum::<u64>(), 1);
    }

    #[test]
    fn a_clock_that_steps_back_gives_nothing_back() {
        let p = BucketedWindow::new(1, MINUTE, 6).unwrap();
        let mut s = BucketedWindowState::default();
        assert!(hit(&p, &mut s, 100).allowed);
        assert!(!hit(&p, &mut s, 30).allowed);
        assert!(!hit(&p, &mut s, 159).allowed);
        assert!(hit(&p, &mut s, 160).allowed);
    }

    #[test]
    fn costs_above_the_limit_never_pass_and_zero_costs_nothing() {
        let p = BucketedWindow::new(2, MINUTE, 4).unwrap();
        let s = BucketedWindowState::default();
        let d = p.decide(&s, at(0), 3);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Decision::NEVER);
        let d = p.decide(&s, at(0), 0);
        assert!(d.allowed);
        assert_eq!(d.remaining, 2);
        assert_eq!(d.reset_after, Duration::ZERO);
    }

    #[test]
    fn a_state_of_another_split_counts_as_empty() {
        let six = BucketedWindow::new(2, MINUTE, 6).unwrap();
        let twelve = BucketedWindow::new(2, MINUTE, 12).unwrap();
        let mut s = BucketedWindowState::default();
        assert!(hit(&six, &mut s, 0).allowed);
        assert!(hit(&six, &mut s, 55).allowed);
        let d = hit(&twelve, &mut s, 59);
        assert!(d.allowed);
        assert_eq!(d.remaining, 1);
        assert_eq!(s.buckets().1.len(), 12);
    }

    #[test]
    fn bad_splits_are_refused_with_a_reason() {
        assert!(matches!(
            BucketedWindow::new(5, MINUTE, 0),
            Err(PolicyError::SubWindows { .. })
        ));
        assert!(matches!(
            BucketedWindow::new(5, MINUTE, 2000),
            Err(PolicyError::SubWindows { .. })
        ));
        let e = BucketedWindow::new(5, Duration::from_nanos(10), 3).unwrap_err();
        assert!(e.to_string().contains("do not divide"), "{e}");
        assert!(BucketedWindow::new(u64::from(u32::MAX) + 1, MINUTE, 4).is_err());
    }
}
