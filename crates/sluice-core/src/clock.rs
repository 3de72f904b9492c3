//! Where "now" comes from.
//!
//! Algorithms never read a clock: they take `now` as an argument. Stores own a [`Clock`] and read
//! it once per call. Tests use [`FakeClock`], which only moves when told to, so no test sleeps.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time: nanoseconds since the Unix epoch.
///
/// Wall-clock based so that clock-aligned windows (a daily window that resets at midnight) mean
/// what an operator expects, and `u64` so that it is cheap to copy, compare and store. It covers
/// the years 1970 to 2554.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// A timestamp `nanos` nanoseconds after the Unix epoch.
    pub const fn from_nanos(nanos: u64) -> Self {
        Timestamp(nanos)
    }

    /// A timestamp `secs` seconds after the Unix epoch, saturating at the far end.
    pub const fn from_secs(secs: u64) -> Self {
        Timestamp(secs.saturating_mul(1_000_000_000))
    }

    /// Nanoseconds since the Unix epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// This timestamp moved `d` later, saturating instead of overflowing.
    pub fn saturating_add(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_nanos(d)))
    }

    /// How long after `earlier` this is, or zero if it is not after it.
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// A duration in whole nanoseconds, saturating at `u64::MAX` (about 584 years).
pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A source of the current time.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The system's clock, made monotonic and cheap to read.
///
/// It reads the wall clock once at creation and then advances with a monotonic counter, so a
/// wall-clock step (NTP, an operator's `date -s`) cannot move time backwards and hand out a fresh
/// quota. The counter is the CPU's time-stamp counter where it is reliable (via `quanta`), which
/// costs a few nanoseconds against a few dozen for the operating system's monotonic clock; where
/// it is not, `quanta` falls back to that clock.
#[derive(Debug, Clone)]
pub struct SystemClock {
    /// The wall-clock time at `anchor`.
    origin: Timestamp,
    /// The monotonic counter.
    counter: quanta::Clock,
    /// The counter's reading that corresponds to `origin`.
    anchor: quanta::Instant,
}

impl SystemClock {
    /// A clock anchored to the wall clock now.
    pub fn new() -> Self {
        let counter = quanta::Clock::new();
        let anchor = counter.now();
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        SystemClock {
            origin: Timestamp(duration_nanos(since_epoch)),
            counter,
            anchor,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        self.origin
            .saturating_add(self.counter.now().duration_since(self.anchor))
    }
}

/// A clock that moves only when told to. Clones share one time.
///
/// ```
/// use std::time::Duration;
/// use sluice_core::{Clock, FakeClock, Timestamp};
///
/// let clock = FakeClock::at(Timestamp::from_secs(60));
/// let shared = clock.clone();
/// clock.advance(Duration::from_secs(1));
/// assert_eq!(shared.now(), Timestamp::from_secs(61));
/// ```
#[derive(Debug, Clone, Default)]
pub struct FakeClock {
    nanos: Arc<AtomicU64>,
}

impl FakeClock {
    /// A fake clock showing `start`.
    pub fn at(start: Timestamp) -> Self {
        FakeClock {
            nanos: Arc::new(AtomicU64::new(start.as_nanos())),
        }
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        let step = duration_nanos(d);
        let _ = self
            .nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_add(step))
            });
    }

    /// Sets the clock to `t`, which may be earlier than now: that is how tests model a clock
    /// that steps backwards.
    pub fn set(&self, t: Timestamp) {
        self.nanos.store(t.as_nanos(), Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.nanos.load(Ordering::SeqCst))
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}
