//! Policies: which algorithm limits a counter, and with which parameters.
//!
//! Every policy is validated when it is built, so an invalid one (a zero window, a rate of nothing
//! per hour) is an error at configuration time and never a panic at decision time. A limit of 0
//! is valid: it blocks outright, as Envoy's `requests_per_unit: 0` does.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::Timestamp;
use crate::algorithm::{
    ALGORITHMS, AlgorithmSpec, BucketedWindow, ConcurrencyLimit, FixedWindow, Gcra, LeakyQueue,
    Magnitudes, SlidingCounter, SlidingLog, StoreParams, TokenBucket,
};
use crate::clock::duration_nanos;

/// Why a policy could not be built. Each message says what was wrong and what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A window or period of zero length.
    #[error("the {what} is zero; give it a length of at least 1ns, such as 1s or 1m")]
    ZeroDuration {
        /// Which duration: "window", "period" or "maximum wait".
        what: &'static str,
    },
    /// A rate that refills nothing while the limit is not zero.
    #[error(
        "the rate is 0 per period but the limit is {limit}; a bucket that never refills is \
             a quota, so use a fixed window, or set the limit to 0 to block outright"
    )]
    ZeroRate {
        /// The limit that would never refill.
        limit: u64,
    },
    /// A limit larger than the algorithm can track.
    #[error("a limit of {limit} is above the {algorithm} maximum of {max}; {hint}")]
    LimitTooLarge {
        /// The algorithm whose bound was exceeded.
        algorithm: Algorithm,
        /// The limit asked for.
        limit: u64,
        /// The largest limit the algorithm takes.
        max: u64,
        /// What to do instead.
        hint: &'static str,
    },
    /// A bucketed window split into no buckets, or into more than it can hold.
    #[error(
        "sub_windows is {sub_windows}; split the window into 1 to {max} buckets, such as 60 \
         one-minute buckets for an hour"
    )]
    SubWindows {
        /// The count asked for.
        sub_windows: u32,
        /// The largest count.
        max: u32,
    },
    /// A bucketed window whose length is not a whole number of nanoseconds per bucket.
    #[error(
        "{sub_windows} sub-windows do not divide a window of {window:?} evenly; pick a count \
         that divides it, such as 60 for an hour"
    )]
    UnevenSubWindows {
        /// The window.
        window: Duration,
        /// The count asked for.
        sub_windows: u32,
    },
}

/// A rate: `amount` units every `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    amount: u64,
    per_nanos: u64,
}

impl Rate {
    /// `amount` per `per`. `per` must not be zero; `amount` may be 0, which only makes sense for a
    /// policy whose limit is 0 as well.
    pub fn new(amount: u64, per: Duration) -> Result<Self, PolicyError> {
        let per_nanos = duration_nanos(per);
        if per_nanos == 0 {
            return Err(PolicyError::ZeroDuration { what: "period" });
        }
        Ok(Rate { amount, per_nanos })
    }

    /// `amount` per second.
    pub fn per_second(amount: u64) -> Self {
        Rate {
            amount,
            per_nanos: 1_000_000_000,
        }
    }

    /// `amount` per minute.
    pub fn per_minute(amount: u64) -> Self {
        Rate {
            amount,
            per_nanos: 60_000_000_000,
        }
    }

    /// Units per period.
    pub fn amount(&self) -> u64 {
        self.amount
    }

    /// The period.
    pub fn per(&self) -> Duration {
        Duration::from_nanos(self.per_nanos)
    }

    pub(crate) fn per_nanos(&self) -> u64 {
        self.per_nanos
    }

    /// The time between two units, rounded up to a whole nanosecond so that rounding never admits
    /// more than the rate. Only meaningful when `amount > 0`.
    pub(crate) fn interval_nanos(&self) -> u64 {
        self.per_nanos.div_ceil(self.amount.max(1)).max(1)
    }

    /// The rate in lowest terms: `(amount, period in nanoseconds)` divided by their greatest
    /// common divisor, which keeps a store's products small without changing a result.
    pub fn lowest_terms(&self) -> (u64, u64) {
        let (mut a, mut b) = (self.amount, self.per_nanos);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        match a {
            0 => (self.amount, self.per_nanos),
            g => (self.amount / g, self.per_nanos / g),
        }
    }

    /// The rate in a counter key's policy id: `amount/nanoseconds`.
    pub(crate) fn key_value(&self) -> String {
        format!("{}/{}", self.amount, self.per_nanos)
    }
}

/// The eight algorithms, by the names the configuration uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// A bucket of `capacity` tokens refilled continuously at a rate.
    TokenBucket,
    /// The leaky bucket as a meter: the generic cell rate algorithm, as nginx `limit_req` uses.
    Gcra,
    /// The leaky bucket as a queue (shaper): excess requests wait for their slot, up to a bound.
    LeakyQueue,
    /// A counter per window, aligned to the clock or starting at the first request.
    FixedWindow,
    /// An exact log of admitted requests over a sliding window.
    SlidingLog,
    /// Two fixed-window counters blended into a sliding estimate.
    SlidingCounter,
    /// The window split into sub-windows, one counter each, summed over the sliding window.
    BucketedWindow,
    /// At most so many requests in flight, each held until its reservation is settled.
    ConcurrencyLimit,
}

impl Algorithm {
    /// Every algorithm, in documentation order: the order of [`ALGORITHMS`].
    pub const ALL: [Algorithm; ALGORITHMS.len()] = {
        let mut all = [Algorithm::TokenBucket; ALGORITHMS.len()];
        let mut i = 0;
        while i < all.len() {
            all[i] = ALGORITHMS[i].algorithm;
            i += 1;
        }
        all
    };

    /// Every algorithm's configuration name, in documentation order.
    pub const NAMES: [&'static str; ALGORITHMS.len()] = {
        let mut names = [""; ALGORITHMS.len()];
        let mut i = 0;
        while i < names.len() {
            names[i] = ALGORITHMS[i].name;
            i += 1;
        }
        names
    };

    /// The algorithm of a limit that names none: fixed windows, as every limit of Envoy's rule
    /// format counts.
    pub const DEFAULT: Algorithm = Algorithm::FixedWindow;

    /// Its entry in the algorithm table.
    pub fn spec(self) -> &'static AlgorithmSpec {
        // The table lists the algorithms in the enum's order; its tests hold it to that.
        &ALGORITHMS[self as usize]
    }

    /// The configuration name, such as `token_bucket`.
    pub fn name(self) -> &'static str {
        self.spec().name
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The name given is not one of the eight algorithms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown algorithm `{0}`; expected one of {names}", names = Algorithm::NAMES.join(", "))]
pub struct UnknownAlgorithm(pub String);

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| UnknownAlgorithm(s.to_owned()))
    }
}

/// A validated policy: one algorithm with its parameters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Policy {
    /// See [`TokenBucket`].
    TokenBucket(TokenBucket),
    /// See [`Gcra`].
    Gcra(Gcra),
    /// See [`LeakyQueue`].
    LeakyQueue(LeakyQueue),
    /// See [`FixedWindow`].
    FixedWindow(FixedWindow),
    /// See [`SlidingLog`].
    SlidingLog(SlidingLog),
    /// See [`SlidingCounter`].
    SlidingCounter(SlidingCounter),
    /// See [`BucketedWindow`].
    BucketedWindow(BucketedWindow),
    /// See [`ConcurrencyLimit`].
    ConcurrencyLimit(ConcurrencyLimit),
}

impl Policy {
    /// Which algorithm this is.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Policy::TokenBucket(_) => Algorithm::TokenBucket,
            Policy::Gcra(_) => Algorithm::Gcra,
            Policy::LeakyQueue(_) => Algorithm::LeakyQueue,
            Policy::FixedWindow(_) => Algorithm::FixedWindow,
            Policy::SlidingLog(_) => Algorithm::SlidingLog,
            Policy::SlidingCounter(_) => Algorithm::SlidingCounter,
            Policy::BucketedWindow(_) => Algorithm::BucketedWindow,
            Policy::ConcurrencyLimit(_) => Algorithm::ConcurrencyLimit,
        }
    }

    /// The limit advertised to clients (`RateLimit-Policy: q=`): a window's limit, or the most a
    /// rate admits at once (a bucket's capacity, GCRA's burst, the queue's one released plus
    /// those waiting).
    pub fn limit(&self) -> u64 {
        match self {
            Policy::TokenBucket(p) => p.capacity(),
            Policy::Gcra(p) => p.burst(),
            Policy::LeakyQueue(p) => p.capacity(),
            Policy::FixedWindow(p) => p.limit(),
            Policy::SlidingLog(p) => p.limit(),
            Policy::SlidingCounter(p) => p.limit(),
            Policy::BucketedWindow(p) => p.limit(),
            Policy::ConcurrencyLimit(p) => p.limit(),
        }
    }

    /// The window [`limit`](Self::limit) is advertised over (`RateLimit-Policy: w=`): a
    /// window's own length; for a rate, the time it takes to grant the whole limit again (a
    /// bucket of 40 refilling at 20 per second: 2 s). "40 per 2 s" is then the rate itself, so
    /// a client that paces itself by `q` over `w` never outruns the limit, and `q` is still the
    /// most it may send at once; "40 per second", the period of the rate, would double it.
    /// A rate of nothing (a limit that blocks outright) keeps its period.
    pub fn window(&self) -> Duration {
        match self {
            Policy::FixedWindow(p) => p.window(),
            Policy::SlidingLog(p) => p.window(),
            Policy::SlidingCounter(p) => p.window(),
            Policy::BucketedWindow(p) => p.window(),
            // No window: the time a hold lasts unreleased, the nearest thing to one.
            Policy::ConcurrencyLimit(p) => p.ttl(),
            Policy::TokenBucket(_) | Policy::Gcra(_) | Policy::LeakyQueue(_) => {
                let rate = self.rate().unwrap_or(Rate::per_second(0));
                if rate.amount() == 0 {
                    return rate.per();
                }
                let nanos = u128::from(self.limit()) * u128::from(rate.per_nanos())
                    / u128::from(rate.amount());
                Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
            }
        }
    }

    /// The limit as Envoy's `requests_per_unit` and `unit` read it: a rate's amount per its
    /// period (20 per second for a bucket of 40 refilling at 20 a second), a window's limit per
    /// its length. Envoy's message has no place for a burst, and its own headers compute a
    /// rate from these two numbers, so they must be the rate.
    pub fn requests_per(&self) -> (u64, Duration) {
        match self.rate() {
            Some(rate) => (rate.amount(), rate.per()),
            None => (self.limit(), self.window()),
        }
    }

    /// The rate of an algorithm that admits at a rate (the token bucket, GCRA, the leaky queue),
    /// as its rule gave it; `None` for a window, whose limit and window say it all.
    pub fn rate(&self) -> Option<Rate> {
        match self {
            Policy::TokenBucket(p) => Some(p.rate()),
            Policy::Gcra(p) => Some(p.rate()),
            Policy::LeakyQueue(p) => Some(p.rate()),
            Policy::FixedWindow(_)
            | Policy::SlidingLog(_)
            | Policy::SlidingCounter(_)
            | Policy::BucketedWindow(_)
            | Policy::ConcurrencyLimit(_) => None,
        }
    }
}

/// The limit as a person reads it, with the rule's own numbers: `60 per minute`, `5 per 30s`,
/// `20 per second, burst 40`, `5 per minute, queue 5 (6 at once)`. A rate and its burst are
/// two numbers; folding them into one ("40 per second") tells the reader a limit that is not
/// there. Every place that shows a limit to a person (the dashboard, the rules listing,
/// `sluice simulate`) shows this.
impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::TokenBucket(p) => write!(f, "{}, burst {}", p.rate(), p.capacity()),
            Policy::Gcra(p) => write!(f, "{}, burst {}", p.rate(), p.burst()),
            Policy::LeakyQueue(p) => write!(
                f,
                "{}, queue {} ({} at once)",
                p.rate(),
                p.queue_size(),
                p.capacity()
            ),
            Policy::FixedWindow(_)
            | Policy::SlidingLog(_)
            | Policy::SlidingCounter(_)
            | Policy::BucketedWindow(_) => {
                write!(f, "{} per {}", self.limit(), Period(self.window()))
            }
            Policy::ConcurrencyLimit(p) => write!(f, "{} in flight", p.limit()),
        }
    }
}

/// `20 per second`, `5 per 30s`.
impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} per {}", self.amount, Period(self.per()))
    }
}

/// A period as limits are read aloud: a unit's name when it is one unit (`second`, `minute`,
/// `hour`, `day`, `week`), else the sum of units a duration is written with (`30s`, `1h30m`,
/// `1500ms`), so that it reads back as the rule wrote it.
struct Period(Duration);

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, &str, u64); 6] = [
            ("week", "w", 604_800_000_000_000),
            ("day", "d", 86_400_000_000_000),
            ("hour", "h", 3_600_000_000_000),
            ("minute", "m", 60_000_000_000),
            ("second", "s", 1_000_000_000),
            ("millisecond", "ms", 1_000_000),
        ];
        let nanos = duration_nanos(self.0);
        if let Some((name, _, _)) = UNITS.iter().find(|(_, _, n)| *n == nanos) {
            return f.write_str(name);
        }
        if nanos % 1_000_000 != 0 {
            return write!(f, "{nanos}ns");
        }
        let mut rest = nanos;
        for (_, suffix, unit) in UNITS {
            if rest >= unit {
                write!(f, "{}{suffix}", rest / unit)?;
                rest %= unit;
            }
        }
        Ok(())
    }
}

/// Policies the service itself needs, whatever its rules say.
impl Policy {
    /// The policy a readiness probe peeks at to see that a store answers (`/readyz`): one unit a
    /// second from a key's first request, which every store holds.
    pub fn probe() -> Policy {
        FixedWindow::probe().into()
    }

    /// A limit in Envoy's rule format, as a per-request override gives one: `limit` per `unit`
    /// on windows aligned on the UTC clock, the algorithm Envoy counts every limit with.
    pub fn envoy_limit(limit: u64, unit: Duration) -> Result<Policy, PolicyError> {
        Ok(FixedWindow::envoy(limit, unit)?.into())
    }

    /// When this is a limit Envoy counts (a fixed window aligned on the clock), the policy of
    /// the counter beside it on the same windows that holds up to `capacity`: where usage that
    /// Envoy reports beyond the limit goes. `None` for any other policy.
    pub fn envoy_overflow(&self, capacity: u64) -> Option<Policy> {
        match self {
            Policy::FixedWindow(p) => p.envoy_overflow(capacity).map(Policy::from),
            _ => None,
        }
    }
}

impl Policy {
    /// Whether this limits requests in flight rather than usage over time: see
    /// [`AlgorithmSpec::concurrent`].
    pub fn concurrent(&self) -> bool {
        self.algorithm().spec().concurrent
    }

    /// The units a request of `cost` takes from this policy: `cost`, except from a limit on
    /// requests in flight, which a reservation takes one slot of whatever its amount, and a
    /// decision without a reservation takes none of (it asks whether one is free), since nothing
    /// would release it.
    pub fn units(&self, cost: u64, reserving: bool) -> u64 {
        match (self.concurrent(), reserving) {
            (false, _) => cost,
            (true, true) => 1,
            (true, false) => 0,
        }
    }

    /// The four numbers a store's script decides this policy on (the Redis scripts' `p1..p4`);
    /// `now` (the application's clock) only names a window start near it for windows on a grid.
    pub fn store_params(&self, now: Timestamp) -> StoreParams {
        match self {
            Policy::TokenBucket(p) => p.store_params(now),
            Policy::Gcra(p) => p.store_params(now),
            Policy::LeakyQueue(p) => p.store_params(now),
            Policy::FixedWindow(p) => p.store_params(now),
            Policy::SlidingLog(p) => p.store_params(now),
            Policy::SlidingCounter(p) => p.store_params(now),
            Policy::BucketedWindow(p) => p.store_params(now),
            Policy::ConcurrencyLimit(p) => p.store_params(now),
        }
    }

    /// The numbers of this policy a store computing in limited precision must hold exactly.
    pub fn magnitudes(&self) -> Magnitudes {
        match self {
            Policy::TokenBucket(p) => p.magnitudes(),
            Policy::Gcra(p) => p.magnitudes(),
            Policy::LeakyQueue(p) => p.magnitudes(),
            Policy::FixedWindow(p) => p.magnitudes(),
            Policy::SlidingLog(p) => p.magnitudes(),
            Policy::SlidingCounter(p) => p.magnitudes(),
            Policy::BucketedWindow(p) => p.magnitudes(),
            Policy::ConcurrencyLimit(p) => p.magnitudes(),
        }
    }

    /// The text that identifies this policy in its counters' keys: the algorithm's name, then
    /// each of the table's key fields with its value, such as
    /// `token_bucket;capacity=10;rate=10/1000000000`. Built from the values rather than from
    /// `Hash`, whose output Rust does not promise to keep across versions or platforms.
    pub fn key_id(&self) -> String {
        let values = match self {
            Policy::TokenBucket(p) => p.key_values(),
            Policy::Gcra(p) => p.key_values(),
            Policy::LeakyQueue(p) => p.key_values(),
            Policy::FixedWindow(p) => p.key_values(),
            Policy::SlidingLog(p) => p.key_values(),
            Policy::SlidingCounter(p) => p.key_values(),
            Policy::BucketedWindow(p) => p.key_values(),
            Policy::ConcurrencyLimit(p) => p.key_values(),
        };
        let spec = self.algorithm().spec();
        let mut id = spec.name.to_owned();
        for (field, value) in spec.key_fields.iter().zip(values) {
            id.push(';');
            id.push_str(field);
            id.push('=');
            id.push_str(&value);
        }
        id
    }
}

macro_rules! policy_from {
    ($($variant:ident),*) => {
        $(impl From<$variant> for Policy {
            fn from(p: $variant) -> Self {
                Policy::$variant(p)
            }
        })*
    };
}
policy_from!(
    TokenBucket,
    Gcra,
    LeakyQueue,
    FixedWindow,
    SlidingLog,
    SlidingCounter,
    BucketedWindow,
    ConcurrencyLimit
);

/// `limit` against the largest an algorithm takes, with a hint at what to use instead.
pub(crate) fn limit_at_most(
    limit: u64,
    max: u64,
    algorithm: Algorithm,
    hint: &'static str,
) -> Result<(), PolicyError> {
    if limit > max {
        return Err(PolicyError::LimitTooLarge {
            algorithm,
            limit,
            max,
            hint,
        });
    }
    Ok(())
}

/// Nanoseconds of a duration that must not be zero.
pub(crate) fn nonzero_nanos(d: Duration, what: &'static str) -> Result<u64, PolicyError> {
    match duration_nanos(d) {
        0 => Err(PolicyError::ZeroDuration { what }),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::PolicyParams;

    fn built(algorithm: Algorithm, params: &PolicyParams) -> Policy {
        algorithm.spec().build(params).unwrap()
    }

    #[test]
    fn a_rate_and_its_burst_read_as_two_numbers() {
        let bucket = Policy::from(TokenBucket::new(40, Rate::per_second(20)).unwrap());
        assert_eq!(bucket.to_string(), "20 per second, burst 40");
        let gcra = Policy::from(Gcra::new(Rate::per_minute(5), 3).unwrap());
        assert_eq!(gcra.to_string(), "5 per minute, burst 3");
        let queue =
            Policy::from(LeakyQueue::new(Rate::per_minute(5), 5, Duration::from_secs(60)).unwrap());
        assert_eq!(queue.to_string(), "5 per minute, queue 5 (6 at once)");
    }

    #[test]
    fn a_window_reads_as_its_limit_per_its_length() {
        let params = PolicyParams::new(60, Duration::from_secs(60));
        assert_eq!(
            built(Algorithm::FixedWindow, &params).to_string(),
            "60 per minute"
        );
        let params = PolicyParams::new(5, Duration::from_secs(90));
        assert_eq!(
            built(Algorithm::SlidingLog, &params).to_string(),
            "5 per 1m30s"
        );
        let params = PolicyParams::new(10_000, Duration::from_secs(86_400));
        assert_eq!(
            built(Algorithm::SlidingCounter, &params).to_string(),
            "10000 per day"
        );
        let params = PolicyParams::new(3, Duration::from_millis(1500));
        assert_eq!(
            built(Algorithm::FixedWindow, &params).to_string(),
            "3 per 1s500ms"
        );
    }

    #[test]
    fn a_rate_is_advertised_as_its_limit_over_the_time_to_grant_it() {
        // 20 a second with a burst of 40: 40 per 2 s, not 40 per second.
        let bucket = Policy::from(TokenBucket::new(40, Rate::per_second(20)).unwrap());
        assert_eq!(
            (bucket.limit(), bucket.window()),
            (40, Duration::from_secs(2))
        );
        assert_eq!(bucket.rate(), Some(Rate::per_second(20)));
        assert_eq!(bucket.requests_per(), (20, Duration::from_secs(1)));
        // Without a burst of its own the bucket holds one period's worth.
        let plain = Policy::from(TokenBucket::new(5, Rate::per_minute(5)).unwrap());
        assert_eq!(plain.window(), Duration::from_secs(60));
        // The queue's limit is one released and five waiting: 6 in 72 s is 5 a minute.
        let queue =
            Policy::from(LeakyQueue::new(Rate::per_minute(5), 5, Duration::from_secs(60)).unwrap());
        assert_eq!(
            (queue.limit(), queue.window()),
            (6, Duration::from_secs(72))
        );
        // A limit that blocks outright keeps its period.
        let blocked = Policy::from(TokenBucket::new(0, Rate::per_second(0)).unwrap());
        assert_eq!(blocked.window(), Duration::from_secs(1));
        let window = built(
            Algorithm::FixedWindow,
            &PolicyParams::new(7, Duration::from_secs(60)),
        );
        assert_eq!(
            (window.limit(), window.window(), window.rate()),
            (7, Duration::from_secs(60), None)
        );
        assert_eq!(window.requests_per(), (7, Duration::from_secs(60)));
    }
}
