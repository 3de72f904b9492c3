//! The concurrency limit: at most `limit` requests at once, per counter. Rules write it
//! `concurrency: N` (docs/rules.md).
//!
//! Its state is the set of holds taken by reservations that are still open: `(taken at, units)`,
//! oldest first. A reservation takes one hold when it is admitted, and its settle removes it
//! again, whatever the reservation used ([`ConcurrencyLimit::refund`]): what limits concurrency is the
//! request being in flight, not what it used. A hold that is never settled (its caller crashed,
//! or the instance that would have settled it died) stops counting `ttl` after it was taken, so
//! the slots of a crashed instance come back by themselves. The reservation's own ttl is cut to
//! this one when it is made, so a reservation never outlives its hold.
//!
//! The holds are kept, taken, released and counted as the sliding log keeps its entries, in an
//! [`ExpiringLog`] whose entries count for the ttl: only the advice to a refused request differs
//! ([`ConcurrencyLimit::RETRY_HINT`]).
//!
//! A decision without a reservation (`/v1/check`, `/json`, Envoy's gRPC) cannot release what
//! it would take, so the engine asks it at cost 0: it answers whether a slot is free, and takes
//! none.
//!
//! Holds taken at the same instant share one entry, so the state never holds more than `limit`
//! entries (plus one per charge: a settle never charges this limit, but an engine that did would
//! only add holds that expire).

use std::time::Duration;

use super::expiring_log::{ExpiringLog, LogLimit};
use crate::Policy;
use crate::algorithm::{Magnitude, Magnitudes, PolicyParams, StoreParams};
use crate::clock::duration_nanos;
use crate::policy::{Algorithm, PolicyError, limit_at_most, nonzero_nanos};
use crate::{Decision, Timestamp};

/// In-flight limit parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConcurrencyLimit {
    limit: u64,
    /// How long a hold counts when its reservation is never settled, in nanoseconds.
    ttl: u64,
}

/// One counter's holds: `(taken at, units)` pairs, oldest first.
pub type ConcurrencyLimitState = ExpiringLog;

impl ConcurrencyLimit {
    /// The most requests in flight one counter takes. Each may cost a hold of 16 bytes.
    pub const MAX_LIMIT: u64 = 1_000_000;

    /// How long a hold lasts when the rule does not say.
    pub const DEFAULT_TTL: Duration = super::DEFAULT_CONCURRENCY_TTL;

    /// The longest a refused request is told to wait (`Retry-After`). A slot comes back as soon
    /// as any request in flight ends, which nothing can foresee; the expiry of the oldest hold
    /// is only the latest it can come back, often minutes away. A client told to wait that long
    /// would idle while slots free, so it is told to try again soon.
    pub const RETRY_HINT: Duration = Duration::from_secs(1);

    /// At most `limit` in flight; a hold not released counts for `ttl`.
    pub fn new(limit: u64, ttl: Duration) -> Result<Self, PolicyError> {
        let ttl = nonzero_nanos(ttl, "ttl")?;
        limit_at_most(
            limit,
            Self::MAX_LIMIT,
            Algorithm::ConcurrencyLimit,
            "a limit on requests in flight this high limits nothing; use a rate instead",
        )?;
        Ok(ConcurrencyLimit { limit, ttl })
    }

    /// The most requests in flight.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// How long a hold counts when its reservation is never settled.
    pub fn ttl(&self) -> Duration {
        Duration::from_nanos(self.ttl)
    }

    /// The holds' bounds: `limit` units in the holds taken within the ttl.
    fn holds(&self) -> LogLimit {
        LogLimit {
            limit: self.limit,
            lifetime: self.ttl,
        }
    }

    /// Decides a request of `cost` slots against `state` at `now`, without changing it. Call
    /// [`ConcurrencyLimit::record`] to admit it when the decision allows.
    ///
    /// A cost of 0 asks whether a slot is free. `reset_after` is the time until the newest hold
    /// expires (when the counter is full again without any settle); a refusal's `retry_after`
    /// is at most [`ConcurrencyLimit::RETRY_HINT`], short of when enough of the oldest holds
    /// expire, the latest the slots come back without a settle.
    pub fn decide(&self, state: &ConcurrencyLimitState, now: Timestamp, cost: u64) -> Decision {
        let mut d = self.holds().decide(state, now, cost);
        if !d.is_permanent_denial() {
            d.retry_after = d.retry_after.min(Self::RETRY_HINT);
        }
        d
    }

    /// Records an admitted request's `cost` holds at `now`, dropping holds that have expired.
    pub fn record(&self, state: &mut ConcurrencyLimitState, now: Timestamp, cost: u64) {
        self.holds().record(state, now, cost);
    }

    /// Releases up to `units` holds taken at `taken_at`: removes them from the newest holds
    /// taken at or before `taken_at` that still count at `now`. A hold that has expired gives
    /// nothing back: its slot came back already, and releasing another in its place would let
    /// one more in than the limit. Holds taken after `taken_at` belong to other requests, and
    /// are left alone.
    pub fn refund(
        &self,
        state: &mut ConcurrencyLimitState,
        units: u64,
        taken_at: Timestamp,
        now: Timestamp,
    ) {
        self.holds().refund(state, units, taken_at, now);
    }

    /// Takes `units` holds at `now` whatever the counter holds, past the limit if need be. A
    /// settle never charges an in-flight limit (it releases the hold whatever was used); this is
    /// the algorithm's charge for the store's contract, and its holds expire like any other.
    pub fn charge(&self, state: &mut ConcurrencyLimitState, units: u64, now: Timestamp) {
        self.holds().charge(state, units, now);
    }

    /// Drops holds that no longer count at `now`.
    pub fn forget_expired(&self, state: &mut ConcurrencyLimitState, now: Timestamp) {
        self.holds().forget_expired(state, now);
    }
}

/// How the rest of Sluice builds and names this algorithm's policies: see the algorithm table.
impl ConcurrencyLimit {
    /// `requests` in flight, each hold counting for the window (the rule's `ttl`).
    pub(crate) fn from_params(p: &PolicyParams) -> Result<Policy, PolicyError> {
        Ok(ConcurrencyLimit::new(p.requests, p.window)?.into())
    }

    /// The values of the table's key fields: limit and ttl.
    pub(crate) fn key_values(&self) -> Vec<String> {
        vec![self.limit.to_string(), self.ttl.to_string()]
    }

    /// The store's parameters: limit and ttl (ns).
    pub(crate) fn store_params(&self, _now: Timestamp) -> StoreParams {
        [
            Some(self.limit),
            Some(duration_nanos(self.ttl())),
            None,
            None,
        ]
    }

    /// The numbers a store must hold: the ttl (the limit is bounded far lower already).
    pub(crate) fn magnitudes(&self) -> Magnitudes {
        Magnitudes::of([Magnitude::Length("ttl", self.ttl())])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(300);

    fn at(secs: u64) -> Timestamp {
        Timestamp::from_secs(secs)
    }

    fn admit(p: &ConcurrencyLimit, s: &mut ConcurrencyLimitState, now: Timestamp) -> Decision {
        let d = p.decide(s, now, 1);
        if d.allowed {
            p.record(s, now, 1);
        }
        d
    }

    #[test]
    fn admits_up_to_the_limit_and_a_release_lets_the_next_in() {
        let p = ConcurrencyLimit::new(2, TTL).unwrap();
        let mut s = ConcurrencyLimitState::default();
        assert!(admit(&p, &mut s, at(10)).allowed);
        assert!(admit(&p, &mut s, at(11)).allowed);
        let refused = admit(&p, &mut s, at(12));
        assert!(!refused.allowed);
        assert_eq!(refused.remaining, 0);
        assert_eq!(refused.retry_after, ConcurrencyLimit::RETRY_HINT);
        // The first request ends: its hold is released, whatever it used.
        p.refund(&mut s, 1, at(10), at(13));
        assert!(admit(&p, &mut s, at(13)).allowed);
        assert!(!admit(&p, &mut s, at(13)).allowed);
    }

    #[test]
    fn a_peek_takes_no_slot() {
        let p = ConcurrencyLimit::new(1, TTL).unwrap();
        let mut s = ConcurrencyLimitState::default();
        let d = p.decide(&s, at(1), 0);
        assert!(d.allowed);
        assert_eq!(d.remaining, 1);
        assert!(admit(&p, &mut s, at(1)).allowed);
        assert!(!p.decide(&s, at(1), 0).allowed);
    }

    #[test]
    fn a_hold_never_released_comes_back_after_its_ttl() {
        let p = ConcurrencyLimit::new(1, TTL).unwrap();
        let mut s = ConcurrencyLimitState::default();
        assert!(admit(&p, &mut s, at(100)).allowed);
        assert!(!admit(&p, &mut s, at(399)).allowed);
        assert!(admit(&p, &mut s, at(400)).allowed);
        // The late release of the expired hold frees nothing: the new one stays held.
        p.refund(&mut s, 1, at(100), at(401));
        assert!(!admit(&p, &mut s, at(401)).allowed);
    }

    #[test]
    fn a_release_leaves_later_holds_alone() {
        let p = ConcurrencyLimit::new(3, TTL).unwrap();
        let mut s = ConcurrencyLimitState::default();
        admit(&p, &mut s, at(1));
        admit(&p, &mut s, at(2));
        p.refund(&mut s, 1, at(1), at(3));
        assert_eq!(s.len(), 1);
        // What is left is the hold taken at 2: it expires 300 s after 2.
        let d = p.decide(&s, at(3), 0);
        assert_eq!(d.reset_after, Duration::from_secs(299));
    }

    #[test]
    fn the_wait_advised_is_short_even_when_the_oldest_hold_expires_late() {
        let p = ConcurrencyLimit::new(1, TTL).unwrap();
        let mut s = ConcurrencyLimitState::default();
        admit(&p, &mut s, at(1));
        let d = p.decide(&s, Timestamp::from_nanos(300_000_000_001), 1);
        assert_eq!(d.retry_after, Duration::from_nanos(999_999_999));
        assert_eq!(p.decide(&s, at(2), 2).retry_after, Decision::NEVER);
    }

    #[test]
    fn a_zero_ttl_and_a_limit_past_the_maximum_are_refused() {
        assert!(ConcurrencyLimit::new(1, Duration::ZERO).is_err());
        assert!(ConcurrencyLimit::new(ConcurrencyLimit::MAX_LIMIT + 1, TTL).is_err());
        assert!(ConcurrencyLimit::new(0, TTL).is_ok());
    }
}
