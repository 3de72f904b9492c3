//! The token bucket: `capacity` tokens, refilled continuously at a rate; a request takes `cost`.

use std::time::Duration;

use super::divisor::Divisor;
use crate::Policy;
use crate::algorithm::PolicyParams;
use crate::algorithm::{Magnitude, Magnitudes, StoreParams};
use crate::policy::{PolicyError, Rate};
use crate::{Decision, Timestamp};

/// Token bucket parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucket {
    capacity: u64,
    refill: Rate,
    /// The refill period in nanoseconds, to divide by without a division instruction.
    per: Divisor,
    /// The refill amount (1 when it is 0), likewise.
    amount: Divisor,
    /// The time one token takes in nanoseconds, when the period divides evenly by the amount
    /// (1 per minute, 100 per second), else 0: the time `n` tokens take is then one
    /// multiplication.
    per_token: u64,
}

/// The state of one bucket: whole tokens, and when the refill was last accounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucketState {
    /// Whole tokens in the bucket at `last`.
    pub tokens: u64,
    /// When `tokens` was last brought up to date. A fraction of a token earned since then is kept
    /// by not moving `last` past the time the whole tokens took to earn.
    pub last: Timestamp,
}

impl TokenBucket {
    /// A bucket holding up to `capacity` tokens, refilled at `refill`. A capacity of 0 blocks every
    /// request; otherwise the refill must be more than zero.
    pub fn new(capacity: u64, refill: Rate) -> Result<Self, PolicyError> {
        if capacity > 0 && refill.amount() == 0 {
            return Err(PolicyError::ZeroRate { limit: capacity });
        }
        Ok(TokenBucket {
            capacity,
            refill,
            per: Divisor::new(refill.per_nanos()),
            amount: Divisor::new(refill.amount()),
            per_token: match refill.amount() {
                0 => 0,
                a if refill.per_nanos() % a == 0 => refill.per_nanos() / a,
                _ => 0,
            },
        })
    }

    /// The most tokens the bucket holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The refill rate.
    pub fn rate(&self) -> Rate {
        self.refill
    }

    /// A full bucket at `now`: the state of a key never seen.
    pub fn initial(&self, now: Timestamp) -> TokenBucketState {
        TokenBucketState {
            tokens: self.capacity,
            last: now,
        }
    }

    /// The bucket brought up to `now`, with the tokens earned since `last`.
    #[inline]
    fn refill(&self, s: TokenBucketState, now: Timestamp) -> TokenBucketState {
        let elapsed = now.as_nanos().saturating_sub(s.last.as_nanos());
        let earned = self.per.mul_div_floor(elapsed, self.refill.amount());
        let tokens = s.tokens.saturating_add(earned);
        if tokens >= self.capacity {
            return self.initial(now);
        }
        // Move `last` only by the time the whole tokens took, so the fraction carries over;
        // rounding up never credits a token early.
        let spent = self.time_for(earned);
        TokenBucketState {
            tokens,
            last: Timestamp::from_nanos(s.last.as_nanos().saturating_add(spent)),
        }
    }

    /// The time `tokens` tokens take to earn in nanoseconds, rounded up, saturating.
    #[inline(always)]
    fn time_for(&self, tokens: u64) -> u64 {
        if self.per_token > 0 {
            // Exactly `tokens·per/amount`, so no rounding; it saturates as the quotient would.
            tokens.saturating_mul(self.per_token)
        } else {
            self.amount.mul_div_ceil(tokens, self.per.get())
        }
    }

    /// Time from `now` until the bucket (at `s`, already refilled) holds `want` tokens.
    #[inline(always)]
    fn time_until(&self, s: TokenBucketState, now: Timestamp, want: u64) -> Duration {
        if s.tokens >= want {
            return Duration::ZERO;
        }
        let wait = self.time_for(want - s.tokens);
        let at = s.last.as_nanos().saturating_add(wait);
        Duration::from_nanos(at.saturating_sub(now.as_nanos()))
    }

    /// Decides a request of `cost` against `state` at `now`. Returns the new state, which the
    /// caller stores only if the decision admits the request.
    ///
    /// A cost of 0 asks whether one more request would pass, and consumes nothing.
    // Always inlined: returned through memory, the state and decision cost a store-forwarding
    // stall per call, which was a fifth of a hot-key decision on the memory store.
    #[inline(always)]
    pub fn decide(
        &self,
        state: TokenBucketState,
        now: Timestamp,
        cost: u64,
    ) -> (TokenBucketState, Decision) {
        let s = self.refill(state, now);
        let need = cost.max(1);
        if need > self.capacity {
            let reset = self.time_until(s, now, self.capacity);
            return (
                s,
                Decision::deny(self.capacity, s.tokens, reset, Decision::NEVER),
            );
        }
        if s.tokens < need {
            let reset = self.time_until(s, now, self.capacity);
            let retry = self.time_until(s, now, need);
            return (s, Decision::deny(self.capacity, s.tokens, reset, retry));
        }
        let after = TokenBucketState {
            tokens: s.tokens - cost,
            last: s.last,
        };
        let reset = self.time_until(after, now, self.capacity);
        (after, Decision::allow(self.capacity, after.tokens, reset))
    }

    /// Gives back `units` tokens at `now`, up to the capacity. Tokens are all alike, so it does
    /// not matter when they were taken: `taken_at` is ignored. A bucket that has refilled since
    /// then has less room to take them back, and a full one takes none, which is what keeps a
    /// refund from ever raising the bucket past its capacity.
    pub fn refund(
        &self,
        state: TokenBucketState,
        units: u64,
        taken_at: Timestamp,
        now: Timestamp,
    ) -> TokenBucketState {
        let _ = taken_at;
        let s = self.refill(state, now);
        let tokens = s.tokens.saturating_add(units);
        if tokens >= self.capacity {
            // Full, as `refill` leaves a full bucket: no fraction carries over.
            return self.initial(now);
        }
        TokenBucketState { tokens, ..s }
    }

    /// Takes `units` tokens at `now` whatever the bucket holds. What the bucket lacks becomes a
    /// debt that the refill pays before it earns any token: `last` moves that far past now, so
    /// every request is refused until the debt is paid and the next token earned, just as if
    /// the bucket had lent the tokens.
    pub fn charge(&self, state: TokenBucketState, units: u64, now: Timestamp) -> TokenBucketState {
        let s = self.refill(state, now);
        if s.tokens >= units {
            return TokenBucketState {
                tokens: s.tokens - units,
                ..s
            };
        }
        let debt = self.time_for(units - s.tokens);
        let from = s.last.max(now).as_nanos();
        TokenBucketState {
            tokens: 0,
            last: Timestamp::from_nanos(from.saturating_add(debt)),
        }
    }
}

/// How the rest of Sluice builds and names this algorithm's policies: see the algorithm table.
impl TokenBucket {
    /// A bucket of `burst` tokens (the requests per window when absent), refilled at the
    /// requests per window.
    pub(crate) fn from_params(p: &PolicyParams) -> Result<Policy, PolicyError> {
        let rate = Rate::new(p.requests, p.window)?;
        Ok(TokenBucket::new(p.burst.unwrap_or(p.requests), rate)?.into())
    }

    /// The values of the table's key fields: capacity and rate.
    pub(crate) fn key_values(&self) -> Vec<String> {
        vec![self.capacity.to_string(), self.refill.key_value()]
    }

    /// The store's parameters: capacity, and the refill amount and period (ns) in lowest terms,
    /// which keep a script's products small without changing a result.
    pub(crate) fn store_params(&self, _now: Timestamp) -> StoreParams {
        let (amount, per) = self.refill.lowest_terms();
        [Some(self.capacity), Some(amount), Some(per), None]
    }

    /// The numbers a store must hold: the capacity and the rate.
    pub(crate) fn magnitudes(&self) -> Magnitudes {
        Magnitudes::of([
            Magnitude::Count("capacity", self.capacity),
            Magnitude::Rate(self.refill),
        ])
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn the_time_tokens_take_is_the_rounded_up_quotient(
            amount in 1u64..1_000,
            per_token in 1u64..1 << 40,
            uneven in 0u64..2,
            tokens: u64,
        ) {
            // Periods that divide evenly by the amount, and some that do not.
            let per = amount * per_token + uneven;
            let bucket = TokenBucket::new(1, Rate::new(amount, Duration::from_nanos(per)).unwrap())
                .unwrap();
            prop_assert_eq!(
                bucket.time_for(tokens),
                crate::arith::mul_div_ceil(tokens, per, amount)
            );
        }
    }
}
