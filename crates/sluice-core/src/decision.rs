//! What a store answers for one check.

use std::time::Duration;

/// The answer to one check. A denial is a decision, not an error.
///
/// Every duration is relative to the moment of the decision, so callers never need the store's
/// clock: a Redis store deciding on Redis time and a gateway writing headers on its own time agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may go ahead (possibly after [`Decision::delay`]).
    pub allowed: bool,
    /// The policy's limit, as advertised in headers (`RateLimit-Policy: q=`).
    pub limit: u64,
    /// How much is left after this decision, in request units.
    pub remaining: u64,
    /// Time until the counter is back to full, so that `remaining == limit` again.
    pub reset_after: Duration,
    /// On a denial, time until the same request could pass: [`Decision::NEVER`] when it never
    /// can (its cost exceeds the capacity, or the limit is 0). Zero when allowed.
    pub retry_after: Duration,
    /// For the queue (shaper) algorithm: how long the request must wait before it is released.
    /// Zero for every other algorithm, and for a request admitted at once.
    pub delay: Duration,
}

impl Decision {
    /// The `retry_after` of a request that can never pass.
    pub const NEVER: Duration = Duration::MAX;

    /// Whether this is a denial that no amount of waiting will lift.
    pub fn is_permanent_denial(&self) -> bool {
        !self.allowed && self.retry_after == Self::NEVER
    }

    pub(crate) fn allow(limit: u64, remaining: u64, reset_after: Duration) -> Self {
        Decision {
            allowed: true,
            limit,
            remaining,
            reset_after,
            retry_after: Duration::ZERO,
            delay: Duration::ZERO,
        }
    }

    pub(crate) fn deny(
        limit: u64,
        remaining: u64,
        reset_after: Duration,
        retry_after: Duration,
    ) -> Self {
        Decision {
            allowed: false,
            limit,
            remaining,
            reset_after,
            retry_after,
            delay: Duration::ZERO,
        }
    }
}
