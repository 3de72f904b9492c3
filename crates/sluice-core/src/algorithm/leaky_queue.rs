//! The leaky bucket as a queue (a shaper): requests leave at a steady rate, and those that arrive
//! faster wait in a bounded queue instead of being rejected.
//!
//! The state is the time the next free slot opens. A request is released at that slot, so its
//! delay is how far the slot lies in the future. It is rejected when it would wait longer than
//! the maximum wait, or find more than `queue_size` requests ahead of it, as nginx's `burst`
//! without `nodelay` does.

use std::time::Duration;

use super::divisor::Divisor;
use crate::Policy;
use crate::algorithm::PolicyParams;
use crate::algorithm::{Magnitude, Magnitudes, StoreParams};
use crate::clock::duration_nanos;
use crate::policy::{PolicyError, Rate};
use crate::{Decision, Timestamp};

/// Queue parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeakyQueue {
    rate: Rate,
    queue_size: u64,
    max_wait: Duration,
    /// The time between two releases, in nanoseconds.
    interval: u64,
    /// The interval again, to divide by without a division instruction.
    interval_div: Divisor,
}

impl LeakyQueue {
    /// Releases requests at `rate`, holding at most `queue_size` waiting ones, none longer than
    /// `max_wait`. A rate of 0 blocks every request.
    pub fn new(rate: Rate, queue_size: u64, max_wait: Duration) -> Result<Self, PolicyError> {
        Ok(LeakyQueue {
            rate,
            queue_size,
            max_wait,
            interval: rate.interval_nanos(),
            interval_div: Divisor::new(rate.interval_nanos()),
        })
    }

    /// The release rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The time between two releases: the rate's period over its amount, rounded up to a whole
    /// nanosecond so that rounding never releases faster than the rate.
    pub fn release_interval(&self) -> Duration {
        Duration::from_nanos(self.interval)
    }

    /// How many requests may wait.
    pub fn queue_size(&self) -> u64 {
        self.queue_size
    }

    /// How many requests the shaper accepts at once: one released now plus `queue_size` waiting.
    /// This is the limit advertised in headers.
    pub fn capacity(&self) -> u64 {
        self.queue_size.saturating_add(1)
    }

    /// The longest a request may wait.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// The longest delay a request of `need` units may be given: bounded by the maximum wait and
    /// by the queue positions in front of its last unit.
    fn admissible_delay(&self, need: u64) -> u64 {
        let by_queue = (self.capacity() - need).saturating_mul(self.interval);
        by_queue.min(duration_nanos(self.max_wait))
    }

    /// Decides a request of `cost` against the next free slot `next` at `now`. Returns the new
    /// next free slot, which the caller stores only if the decision admits the request. An
    /// admitted decision carries the delay before the request is released.
    ///
    /// A cost of 0 asks whether one more request would be queued, and consumes nothing.
    // Always inlined, as the token bucket's: see there.
    #[inline(always)]
    pub fn decide(&self, next: Timestamp, now: Timestamp, cost: u64) -> (Timestamp, Decision) {
        let limit = self.capacity();
        let now_n = now.as_nanos();
        let start = next.as_nanos().max(now_n);
        let delay = start - now_n;
        let reset = Duration::from_nanos(delay);
        let max_wait = duration_nanos(self.max_wait);
        // How many more single requests would be accepted behind a backlog of this length.
        let free = |backlog: u64| {
            let by_queue = limit.saturating_sub(self.interval_div.div_ceil(backlog));
            let by_wait = match max_wait.checked_sub(backlog) {
                Some(slack) => self.interval_div.div(slack) + 1,
                None => 0,
            };
            by_queue.min(by_wait)
        };
        let need = cost.max(1);
        if self.rate.amount() == 0 || need > limit {
            return (
                next,
                Decision::deny(limit, free(delay), reset, Decision::NEVER),
            );
        }
        let bound = self.admissible_delay(need);
        if delay > bound {
            let retry = Duration::from_nanos(delay - bound);
            return (next, Decision::deny(limit, free(delay), reset, retry));
        }
        let new_next = start.saturating_add(cost.saturating_mul(self.interval));
        let backlog = new_next - now_n;
        let mut decision = Decision::allow(limit, free(backlog), Duration::from_nanos(backlog));
        decision.delay = Duration::from_nanos(delay);
        (Timestamp::from_nanos(new_next), decision)
    }

    /// Gives back `units` queue slots at `now`: the next free slot moves `units` release
    /// intervals earlier, but never before now, since a slot in the past is no slot at all and
    /// an empty queue has nothing to give back. Slots are all alike, so `taken_at` is ignored.
    pub fn refund(
        &self,
        next: Timestamp,
        units: u64,
        taken_at: Timestamp,
        now: Timestamp,
    ) -> Timestamp {
        let _ = taken_at;
        if next <= now {
            return next;
        }
        let back = next
            .as_nanos()
            .saturating_sub(units.saturating_mul(self.interval));
        Timestamp::from_nanos(back.max(now.as_nanos()))
    }

    /// Takes `units` slots at `now` whatever the queue holds: the next free slot moves `units`
    /// release intervals later, past the queue's size if need be, so requests are refused
    /// until the queue has drained back within its bounds.
    pub fn charge(&self, next: Timestamp, units: u64, now: Timestamp) -> Timestamp {
        let from = next.max(now).as_nanos();
        Timestamp::from_nanos(from.saturating_add(units.saturating_mul(self.interval)))
    }
}

/// How the rest of Sluice builds and names this algorithm's policies: see the algorithm table.
impl LeakyQueue {
    /// Releases at the requests per window, holding `queue_size` waiting (the requests per
    /// window when absent) for at most `max_wait` (the window when absent; zero is refused).
    pub(crate) fn from_params(p: &PolicyParams) -> Result<Policy, PolicyError> {
        let rate = Rate::new(p.requests, p.window)?;
        let max_wait = match p.max_wait {
            Some(w) if w.is_zero() => {
                return Err(PolicyError::ZeroDuration {
                    what: "maximum wait",
                });
            }
            Some(w) => w,
            None => p.window,
        };
        Ok(LeakyQueue::new(rate, p.queue_size.unwrap_or(p.requests), max_wait)?.into())
    }

    /// The values of the table's key fields: queue size, maximum wait and rate.
    pub(crate) fn key_values(&self) -> Vec<String> {
        vec![
            self.queue_size.to_string(),
            self.max_wait.as_nanos().to_string(),
            self.rate.key_value(),
        ]
    }

    /// The store's parameters: capacity, release interval (ns), maximum wait (ns; past 2⁵³ ns,
    /// about 104 days, as good as unbounded, so held there) and 1 if the rate is 0.
    pub(crate) fn store_params(&self, _now: Timestamp) -> StoreParams {
        let max_wait = duration_nanos(self.max_wait).min((1 << 53) - 1);
        [
            Some(self.capacity()),
            Some(self.interval),
            Some(max_wait),
            Some(u64::from(self.rate.amount() == 0)),
        ]
    }

    /// The numbers a store must hold: the capacity, the interval, and the time a full queue
    /// takes to drain. A queue with a rate of 0 admits nothing, so its capacity builds no
    /// backlog.
    pub(crate) fn magnitudes(&self) -> Magnitudes {
        let interval = self.release_interval();
        let numbers = Magnitudes::of([
            Magnitude::Count("queue capacity", self.capacity()),
            Magnitude::Length("release interval", interval),
        ]);
        if self.rate.amount() > 0 {
            numbers.and(Magnitude::Backlog(
                "queue capacity",
                self.capacity(),
                interval,
            ))
        } else {
            numbers
        }
    }
}
