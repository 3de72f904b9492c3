//! A circuit breaker, so that while Redis is down answers come in microseconds instead of each
//! waiting for its timeout.
//!
//! Closed, it counts consecutive transient failures; at the threshold it opens. Open, every call
//! fails at once without touching the network, until the cool-down has passed; then one call is
//! let through as a probe (half-open). The probe's success closes the breaker, its failure opens
//! it for another cool-down. Denials are not failures, and neither are permanent refusals
//! (`StoreError::Rejected`): only the store's health counts.
//!
//! A store on one server (or behind Sentinel) has one breaker. On a Cluster each master has its
//! own (`masters.rs`), so that a master that is down fails only the calls on its own slots.

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_core::BreakerState;

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

/// The breaker itself: three atomics, so the closed path costs two relaxed loads.
#[derive(Debug)]
pub(crate) struct Breaker {
    state: AtomicU8,
    /// Consecutive transient failures while closed.
    failures: AtomicU32,
    /// When an open breaker lets a probe through, in nanoseconds after `origin`.
    reopen_at: AtomicU64,
    /// Calls failed at once because the breaker was open, for metrics.
    short_circuited: AtomicU64,
    /// The monotonic reference for `reopen_at`.
    origin: Instant,
    threshold: u32,
    cool_down: Duration,
}

/// Permission to call the store, from [`Breaker::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permit {
    /// An ordinary call.
    Call,
    /// The one probe of a half-open breaker.
    Probe,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cool_down: Duration) -> Self {
        Breaker {
            state: AtomicU8::new(CLOSED),
            failures: AtomicU32::new(0),
            reopen_at: AtomicU64::new(0),
            short_circuited: AtomicU64::new(0),
            origin: Instant::now(),
            threshold: threshold.max(1),
            cool_down,
        }
    }

    fn elapsed_nanos(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether a call may go to the store now. `None` means fail at once.
    pub(crate) fn admit(&self) -> Option<Permit> {
        match self.state.load(Ordering::Acquire) {
            CLOSED => Some(Permit::Call),
            OPEN if self.elapsed_nanos() >= self.reopen_at.load(Ordering::Acquire) => {
                // Exactly one caller wins the probe.
                match self.state.compare_exchange(
                    OPEN,
                    HALF_OPEN,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => Some(Permit::Probe),
                    Err(_) => self.refuse(),
                }
            }
            _ => self.refuse(),
        }
    }

    fn refuse(&self) -> Option<Permit> {
        self.short_circuited.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Records a call that reached the store and got an answer.
    pub(crate) fn success(&self, permit: Permit) {
        self.failures.store(0, Ordering::Relaxed);
        // Only the probe closes an open breaker: a slow call admitted before it opened says
        // little about the store now.
        if permit == Permit::Probe {
            self.state.store(CLOSED, Ordering::Release);
        }
    }

    /// Gives back a permit that was not used: a request that needs several masters and was
    /// refused by one of them sends nothing to the others. A probe given back leaves the breaker
    /// open with its cool-down over, so that the next caller probes.
    pub(crate) fn release(&self, permit: Permit) {
        if permit == Permit::Probe {
            let _ =
                self.state
                    .compare_exchange(HALF_OPEN, OPEN, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// Records a call that failed for a transient reason.
    pub(crate) fn failure(&self, permit: Permit) {
        if permit == Permit::Probe {
            self.open();
            return;
        }
        let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= self.threshold
            && self
                .state
                .compare_exchange(CLOSED, OPEN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.open();
        }
    }

    fn open(&self) {
        let cool = u64::try_from(self.cool_down.as_nanos()).unwrap_or(u64::MAX);
        self.reopen_at
            .store(self.elapsed_nanos().saturating_add(cool), Ordering::Release);
        self.failures.store(0, Ordering::Relaxed);
        self.state.store(OPEN, Ordering::Release);
    }

    /// The current state.
    pub(crate) fn state(&self) -> BreakerState {
        match self.state.load(Ordering::Acquire) {
            CLOSED => BreakerState::Closed,
            OPEN => BreakerState::Open,
            _ => BreakerState::HalfOpen,
        }
    }

    /// How many calls failed at once because the breaker was open.
    pub(crate) fn short_circuited(&self) -> u64 {
        self.short_circuited.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_at_the_threshold_and_probes_once_after_the_cool_down() {
        let b = Breaker::new(3, Duration::ZERO);
        for _ in 0..2 {
            let p = b.admit().unwrap();
            b.failure(p);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        let p = b.admit().unwrap();
        b.failure(p);
        assert_eq!(b.state(), BreakerState::Open);
        // With no cool-down, the next caller probes, and everyone else is refused meanwhile.
        assert_eq!(b.admit(), Some(Permit::Probe));
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert_eq!(b.admit(), None);
        b.failure(Permit::Probe);
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.admit(), Some(Permit::Probe));
        b.success(Permit::Probe);
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.short_circuited(), 1);
    }

    #[test]
    fn an_open_breaker_refuses_until_its_cool_down_ends() {
        let b = Breaker::new(1, Duration::from_secs(3600));
        b.failure(b.admit().unwrap());
        for _ in 0..10 {
            assert_eq!(b.admit(), None);
        }
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.short_circuited(), 10);
    }

    #[test]
    fn a_probe_given_back_lets_the_next_caller_probe() {
        let b = Breaker::new(1, Duration::ZERO);
        b.failure(b.admit().unwrap());
        let probe = b.admit().unwrap();
        assert_eq!(probe, Permit::Probe);
        assert_eq!(b.admit(), None);
        b.release(probe);
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.admit(), Some(Permit::Probe));
        b.release(Permit::Call);
        assert_eq!(
            b.state(),
            BreakerState::HalfOpen,
            "an ordinary call changes nothing"
        );
    }

    #[test]
    fn a_success_resets_the_count_of_failures() {
        let b = Breaker::new(2, Duration::from_secs(3600));
        b.failure(Permit::Call);
        b.success(Permit::Call);
        b.failure(Permit::Call);
        assert_eq!(b.state(), BreakerState::Closed);
    }
}
