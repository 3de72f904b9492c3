//! `ShouldRateLimit`'s response times as Envoy measures them, in whole milliseconds (cut, not
//! rounded), counted per millisecond: one atomic add per call, whatever the rate, where Envoy
//! sends one statsd line per call. A flush reports each millisecond once, with how many calls
//! took it (see `statsd.rs`), and Prometheus reads the same counts as a histogram.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Response times below this many milliseconds each have their own atomic counter; slower
/// ones, rare, share a map behind a lock.
const FINE_MS: usize = 4096;

/// Calls by their response time in whole milliseconds, since start.
pub(super) struct ResponseTimes {
    by_ms: Box<[AtomicU64]>,
    slow: Mutex<BTreeMap<u64, u64>>,
}

impl ResponseTimes {
    pub(super) fn new() -> Self {
        ResponseTimes {
            by_ms: (0..FINE_MS).map(|_| AtomicU64::new(0)).collect(),
            slow: Mutex::new(BTreeMap::new()),
        }
    }

    /// Counts one call that took `took`.
    pub(super) fn record(&self, took: Duration) {
        let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        match usize::try_from(ms).ok().and_then(|i| self.by_ms.get(i)) {
            Some(count) => {
                count.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                let mut slow = self.slow.lock().unwrap_or_else(|p| p.into_inner());
                *slow.entry(ms).or_insert(0) += 1;
            }
        }
    }

    /// Every response time seen, in milliseconds, with how many calls took it since start,
    /// fastest first.
    pub(super) fn totals(&self) -> Vec<(u64, u64)> {
        let mut totals: Vec<(u64, u64)> = (0u64..)
            .zip(self.by_ms.iter())
            .map(|(ms, count)| (ms, count.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect();
        let slow = self.slow.lock().unwrap_or_else(|p| p.into_inner());
        totals.extend(slow.iter().map(|(ms, n)| (*ms, *n)));
        totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_by_whole_milliseconds() {
        let times = ResponseTimes::new();
        for took in [
            Duration::from_micros(300),
            Duration::from_micros(999),
            Duration::from_micros(1_700),
            Duration::from_secs(5),
            Duration::from_secs(5),
        ] {
            times.record(took);
        }
        assert_eq!(times.totals(), vec![(0, 2), (1, 1), (5_000, 2)]);
    }
}
