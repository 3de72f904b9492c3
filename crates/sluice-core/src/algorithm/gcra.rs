//! The leaky bucket as a meter: the generic cell rate algorithm (GCRA).
//!
//! The state is one timestamp, the theoretical arrival time (TAT) of the next request if traffic
//! flowed exactly at the rate. A request conforms when admitting it would not push the TAT more
//! than `burst` emission intervals past now. This is the virtual-scheduling form of ITU-T I.371,
//! with the tolerance `τ = (burst - 1)·T`, and what nginx `limit_req` implements.

use std::time::Duration;

use super::divisor::Divisor;
use crate::policy::{Algorithm, PolicyError, Rate};

/// The longest a GCRA backlog may reach: a century. Keeping `now + backlog` far below `u64::MAX`
/// means the arithmetic below cannot overflow.
const MAX_HORIZON_NANOS: u64 = 100 * 365 * 86_400 * 1_000_000_000;
use crate::Policy;
use crate::algorithm::PolicyParams;
use crate::algorithm::{Magnitude, Magnitudes, StoreParams};
use crate::clock::duration_nanos;
use crate::{Decision, Timestamp};

/// GCRA parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Gcra {
    rate: Rate,
    burst: u64,
    /// `T`, the emission interval in nanoseconds, precomputed from the rate.
    interval: u64,
    /// `T` again, to divide by without a division instruction.
    interval_div: Divisor,
}

impl Gcra {
    /// Requests conform at `rate`, with up to `burst` of them back to back. A burst of 0 blocks
    /// every request; otherwise the rate must be more than zero.
    pub fn new(rate: Rate, burst: u64) -> Result<Self, PolicyError> {
        if burst > 0 && rate.amount() == 0 {
            return Err(PolicyError::ZeroRate { limit: burst });
        }
        let interval = rate.interval_nanos();
        if burst
            .checked_mul(interval)
            .is_none_or(|h| h > MAX_HORIZON_NANOS)
        {
            return Err(PolicyError::LimitTooLarge {
                algorithm: Algorithm::Gcra,
                limit: burst,
                max: MAX_HORIZON_NANOS / interval,
                hint: "a burst that takes over a century to drain at this rate is no limit; \
                       lower the burst or raise the rate",
            });
        }
        Ok(Gcra {
            rate,
            burst,
            interval,
            interval_div: Divisor::new(interval),
        })
    }

    /// The rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// How many requests may arrive back to back.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The emission interval `T`: the time one request's worth of capacity takes to come back.
    pub fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.interval)
    }

    /// Decides a request of `cost` against the theoretical arrival time `tat` at `now`. Returns
    /// the new TAT, which the caller stores only if the decision admits the request. A fresh key
    /// has a TAT of [`Timestamp::EPOCH`] (anything not after `now`).
    ///
    /// A cost of 0 asks whether one more request would pass, and consumes nothing.
    // Always inlined, as the token bucket's: see there.
    #[inline(always)]
    pub fn decide(&self, tat: Timestamp, now: Timestamp, cost: u64) -> (Timestamp, Decision) {
        let now_n = now.as_nanos();
        let tat_n = tat.as_nanos().max(now_n);
        let horizon = self.burst.saturating_mul(self.interval);
        let backlog = tat_n - now_n;
        let need = cost.max(1);
        let reset = Duration::from_nanos(backlog);
        let free = |backlog: u64| self.interval_div.div(horizon.saturating_sub(backlog));
        if need > self.burst {
            return (
                tat,
                Decision::deny(self.burst, free(backlog), reset, Decision::NEVER),
            );
        }
        let wanted = backlog.saturating_add(need.saturating_mul(self.interval));
        if wanted > horizon {
            let retry = Duration::from_nanos(wanted - horizon);
            return (tat, Decision::deny(self.burst, free(backlog), reset, retry));
        }
        let new_backlog = backlog + cost * self.interval;
        // Saturating: a clock at the end of time must not overflow.
        let new_tat = Timestamp::from_nanos(now_n.saturating_add(new_backlog));
        let decision = Decision::allow(
            self.burst,
            free(new_backlog),
            Duration::from_nanos(new_backlog),
        );
        (new_tat, decision)
    }

    /// Gives back `units` requests' worth at `now`: the arrival time moves back `units`
    /// emission intervals, but never before now. A TAT at or before now is a full burst
    /// already, so there is nothing to give back; stopping at now is what keeps a refund from
    /// raising the burst past its size. As in the token bucket, capacity is all alike, so
    /// `taken_at` is ignored.
    pub fn refund(
        &self,
        tat: Timestamp,
        units: u64,
        taken_at: Timestamp,
        now: Timestamp,
    ) -> Timestamp {
        let _ = taken_at;
        if tat <= now {
            return tat;
        }
        let back = tat
            .as_nanos()
            .saturating_sub(units.saturating_mul(self.interval));
        Timestamp::from_nanos(back.max(now.as_nanos()))
    }

    /// Takes `units` requests' worth at `now` whatever the backlog: the arrival time moves
    /// `units` emission intervals later, past the burst if need be, so requests are refused
    /// until the excess has drained at the rate.
    pub fn charge(&self, tat: Timestamp, units: u64, now: Timestamp) -> Timestamp {
        let from = tat.max(now).as_nanos();
        Timestamp::from_nanos(from.saturating_add(units.saturating_mul(self.interval)))
    }
}

/// How the rest of Sluice builds and names this algorithm's policies: see the algorithm table.
impl Gcra {
    /// The requests per window as the rate, with a burst of `burst` (the requests per window
    /// when absent).
    pub(crate) fn from_params(p: &PolicyParams) -> Result<Policy, PolicyError> {
        let rate = Rate::new(p.requests, p.window)?;
        Ok(Gcra::new(rate, p.burst.unwrap_or(p.requests))?.into())
    }

    /// The values of the table's key fields: burst and rate.
    pub(crate) fn key_values(&self) -> Vec<String> {
        vec![self.burst().to_string(), self.rate().key_value()]
    }

    /// The store's parameters: burst and emission interval (ns).
    pub(crate) fn store_params(&self, _now: Timestamp) -> StoreParams {
        let interval = duration_nanos(self.emission_interval());
        [Some(self.burst()), Some(interval), None, None]
    }

    /// The numbers a store must hold: the burst, the interval, and the time the burst takes to
    /// drain, the longest its arrival time lies ahead of now.
    pub(crate) fn magnitudes(&self) -> Magnitudes {
        let interval = self.emission_interval();
        Magnitudes::of([
            Magnitude::Count("burst", self.burst()),
            Magnitude::Length("emission interval", interval),
            Magnitude::Backlog("burst", self.burst(), interval),
        ])
    }
}
