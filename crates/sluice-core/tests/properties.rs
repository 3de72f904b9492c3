//! Each algorithm's promise, stated as a property over any sequence of requests and clock moves.

use std::collections::VecDeque;
use std::time::Duration;

use proptest::prelude::*;
use sluice_core::{
    Alignment, BucketedWindow, BucketedWindowState, FixedWindow, Gcra, LeakyQueue, Rate,
    SlidingCounter, SlidingCounterState, SlidingLog, SlidingLogState, Timestamp, TokenBucket,
};

/// A request: how long after the previous one it arrives (ns), and its cost.
fn requests() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..3_000_000_000, 0u64..4), 1..200)
}

/// The arrival times of `steps`, starting at a fixed, non-aligned instant.
fn arrivals(steps: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut t = 1_000_000_000_123;
    steps
        .iter()
        .map(|&(gap, cost)| {
            t += gap;
            (t, cost)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The sliding log never admits more than `limit` units in any window, and always admits
    /// what fits.
    #[test]
    fn sliding_log_never_exceeds_the_limit_in_any_window(
        limit in 0u64..12,
        window_ms in 1u64..5_000,
        steps in requests(),
    ) {
        let window = window_ms * 1_000_000;
        let log = SlidingLog::new(limit, Duration::from_nanos(window)).unwrap();
        let mut state = SlidingLogState::default();
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (t, cost) in arrivals(&steps) {
            let d = log.decide(&state, Timestamp::from_nanos(t), cost);
            let in_window: u64 = admitted.iter().filter(|(a, _)| a + window > t).map(|(_, c)| c).sum();
            prop_assert_eq!(d.allowed, in_window + cost.max(1) <= limit, "exact at t={}", t);
            prop_assert_eq!(d.remaining, limit - in_window - if d.allowed { cost } else { 0 });
            if d.allowed {
                log.record(&mut state, Timestamp::from_nanos(t), cost);
                admitted.push((t, cost));
            }
            prop_assert!(state.len() as u64 <= limit.max(1));
        }
        // Every window ending at an admission holds at most `limit` units.
        for &(end, _) in &admitted {
            let sum: u64 = admitted.iter().filter(|(a, _)| *a <= end && a + window > end).map(|(_, c)| c).sum();
            prop_assert!(sum <= limit);
        }
    }

    /// The bucketed window is exact over its buckets: it admits a request if and only if the
    /// buckets in the window hold room for it, so no run of `sub_windows` consecutive buckets
    /// (any window starting on a bucket boundary) ever holds more than `limit`; and its memory is
    /// the buckets, never more.
    #[test]
    fn bucketed_window_never_exceeds_the_limit_in_any_aligned_window(
        limit in 0u64..12,
        bucket_ms in 1u64..1_000,
        sub_windows in 1u32..12,
        steps in requests(),
    ) {
        let bucket = bucket_ms * 1_000_000;
        let n = u64::from(sub_windows);
        let window = Duration::from_nanos(bucket * n);
        let p = BucketedWindow::new(limit, window, sub_windows).unwrap();
        let mut state = BucketedWindowState::default();
        // Admitted units by bucket index.
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        let mut newest = 0;
        for (t, cost) in arrivals(&steps) {
            let now = Timestamp::from_nanos(t);
            let current = (t / bucket).max(newest);
            let live: u64 = admitted.iter().filter(|(i, _)| i + n > current).map(|(_, c)| c).sum();
            let d = p.decide(&state, now, cost);
            prop_assert_eq!(d.allowed, live + cost.max(1) <= limit, "exact at t={}", t);
            prop_assert_eq!(d.remaining, limit.saturating_sub(live) - if d.allowed { cost } else { 0 });
            if !d.allowed && d.retry_after != sluice_core::Decision::NEVER {
                // Retrying when it says admits the same request.
                let later = now.saturating_add(d.retry_after);
                prop_assert!(p.decide(&state, later, cost).allowed, "retry_after at t={}", t);
            }
            if d.allowed {
                p.record(&mut state, now, cost);
                newest = current;
                admitted.push((current, cost));
            }
            prop_assert!(state.buckets().1.len() as u64 <= n);
        }
        // The fullest run of buckets starts at a bucket that admitted something.
        for &(start, _) in &admitted {
            let sum: u64 = admitted.iter().filter(|(i, _)| *i >= start && *i < start + n).map(|(_, c)| c).sum();
            prop_assert!(sum <= limit, "{} units in the buckets from {}", sum, start);
        }
    }

    /// A token bucket never admits more than `capacity + rate·t` units over any interval `t`.
    #[test]
    fn token_bucket_never_exceeds_capacity_plus_refill(
        capacity in 1u64..10,
        amount in 1u64..10,
        per_ms in 1u64..5_000,
        steps in requests(),
    ) {
        let per = per_ms * 1_000_000;
        let bucket = TokenBucket::new(capacity, Rate::new(amount, Duration::from_nanos(per)).unwrap()).unwrap();
        let times = arrivals(&steps);
        let mut state = bucket.initial(Timestamp::from_nanos(times[0].0));
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for &(t, cost) in &times {
            let (next, d) = bucket.decide(state, Timestamp::from_nanos(t), cost);
            prop_assert!(d.remaining <= capacity);
            if d.allowed {
                state = next;
                admitted.push((t, cost));
            }
        }
        for i in 0..admitted.len() {
            let mut sum = 0u128;
            for j in i..admitted.len() {
                sum += u128::from(admitted[j].1);
                let span = u128::from(admitted[j].0 - admitted[i].0);
                let bound = u128::from(capacity) + span * u128::from(amount) / u128::from(per);
                prop_assert!(sum <= bound, "{} units over {}ns, bound {}", sum, span, bound);
            }
        }
    }

    /// GCRA matches ITU-T I.371's virtual scheduling algorithm, cell by cell: with emission
    /// interval `T` and tolerance `τ = (burst − 1)·T`, a cell arriving at `ta` conforms iff
    /// `TAT ≤ ta + τ`, and then `TAT := max(TAT, ta) + T`.
    #[test]
    fn gcra_matches_virtual_scheduling(
        burst in 1u64..10,
        amount in 1u64..10,
        per_ms in 1u64..5_000,
        gaps in prop::collection::vec(0u64..2_000_000_000, 1..300),
    ) {
        let rate = Rate::new(amount, Duration::from_millis(per_ms)).unwrap();
        let gcra = Gcra::new(rate, burst).unwrap();
        let t_interval = u64::try_from(gcra.emission_interval().as_nanos()).unwrap();
        let tau = (burst - 1) * t_interval;
        let mut reference_tat = 0u64;
        let mut tat = Timestamp::EPOCH;
        let mut ta = 5_000_000_000u64;
        for gap in gaps {
            ta += gap;
            let conforms = reference_tat <= ta + tau;
            if conforms {
                reference_tat = reference_tat.max(ta) + t_interval;
            }
            let (next, d) = gcra.decide(tat, Timestamp::from_nanos(ta), 1);
            prop_assert_eq!(d.allowed, conforms);
            if d.allowed {
                tat = next;
                prop_assert_eq!(tat.as_nanos(), reference_tat);
            } else {
                // Retrying after `retry_after` conforms, and a nanosecond earlier does not.
                let retry = u64::try_from(d.retry_after.as_nanos()).unwrap();
                prop_assert!(reference_tat <= ta + retry + tau);
                prop_assert!(reference_tat > ta + retry - 1 + tau);
            }
        }
    }

    /// The sliding counter's estimate is never negative and never above what the two windows
    /// hold; it never admits more than the limit by its own estimate, and never more than twice
    /// the limit in any real window.
    #[test]
    fn sliding_counter_estimate_is_sound(
        limit in 0u64..20,
        window_ms in 1u64..5_000,
        steps in requests(),
    ) {
        let window = window_ms * 1_000_000;
        let counter = SlidingCounter::new(limit, Duration::from_nanos(window)).unwrap();
        let mut state = SlidingCounterState::default();
        let mut admitted: VecDeque<(u64, u64)> = VecDeque::new();
        for (t, cost) in arrivals(&steps) {
            let now = Timestamp::from_nanos(t);
            let estimate = counter.estimate(state, now);
            let exact_two_windows: u64 = admitted.iter().filter(|(a, _)| a + 2 * window > t).map(|(_, c)| c).sum();
            prop_assert!(i128::from(estimate) >= 0);
            prop_assert!(estimate <= exact_two_windows);
            let (next, d) = counter.decide(state, now, cost);
            prop_assert_eq!(d.allowed, estimate + cost.max(1) <= limit);
            if d.allowed {
                state = next;
                admitted.push_back((t, cost));
                prop_assert!(counter.estimate(state, now) <= limit);
            }
            let in_window: u64 = admitted.iter().filter(|(a, _)| a + window > t).map(|(_, c)| c).sum();
            prop_assert!(in_window <= 2 * limit);
        }
    }

    /// A fixed window never admits more than the limit within one window.
    #[test]
    fn fixed_window_never_exceeds_the_limit_per_window(
        limit in 0u64..12,
        window_ms in 1u64..5_000,
        offset in -50_000i32..50_000,
        first_request in any::<bool>(),
        steps in requests(),
    ) {
        let window = window_ms * 1_000_000;
        let alignment = if first_request {
            Alignment::FirstRequest
        } else {
            Alignment::Clock { utc_offset_secs: offset }
        };
        let fixed = FixedWindow::new(limit, Duration::from_nanos(window), alignment).unwrap();
        let mut state = Default::default();
        let mut per_window: std::collections::HashMap<u64, u64> = Default::default();
        for (t, cost) in arrivals(&steps) {
            let (next, d) = fixed.decide(state, Timestamp::from_nanos(t), cost);
            if d.allowed {
                state = next;
                let start = next.start.as_nanos();
                prop_assert!(start <= t && t < start + window);
                *per_window.entry(start).or_default() += cost;
            }
        }
        prop_assert!(per_window.values().all(|&n| n <= limit));
    }

    /// The queue releases requests no faster than its rate, never holds more than its size, and
    /// never delays a request beyond the maximum wait.
    #[test]
    fn leaky_queue_shapes_to_its_rate(
        amount in 1u64..10,
        per_ms in 1u64..5_000,
        queue_size in 0u64..8,
        max_wait_ms in 0u64..10_000,
        steps in requests(),
    ) {
        let rate = Rate::new(amount, Duration::from_millis(per_ms)).unwrap();
        let queue = LeakyQueue::new(rate, queue_size, Duration::from_millis(max_wait_ms)).unwrap();
        let interval = (per_ms * 1_000_000).div_ceil(amount);
        let mut next = Timestamp::EPOCH;
        let mut releases: Vec<(u64, u64)> = Vec::new();
        for (t, cost) in arrivals(&steps) {
            let (after, d) = queue.decide(next, Timestamp::from_nanos(t), cost);
            if d.allowed {
                prop_assert!(d.delay <= Duration::from_millis(max_wait_ms));
                let release = t + u64::try_from(d.delay.as_nanos()).unwrap();
                if let Some(&(prev, prev_cost)) = releases.last() {
                    prop_assert!(release >= prev + prev_cost * interval);
                }
                releases.push((release, cost));
                next = after;
            }
        }
    }
}

#[test]
fn zero_limits_block_everything_and_zero_windows_are_errors() {
    let never = |d: sluice_core::Decision| !d.allowed && d.is_permanent_denial();
    let now = Timestamp::from_secs(10);
    let zero_rate = Rate::per_second(0);
    assert!(never(
        TokenBucket::new(0, zero_rate)
            .unwrap()
            .decide(TokenBucket::new(0, zero_rate).unwrap().initial(now), now, 1)
            .1
    ));
    assert!(never(
        Gcra::new(zero_rate, 0)
            .unwrap()
            .decide(Timestamp::EPOCH, now, 1)
            .1
    ));
    assert!(never(
        LeakyQueue::new(zero_rate, 3, Duration::from_secs(1))
            .unwrap()
            .decide(Timestamp::EPOCH, now, 1)
            .1
    ));
    let fw = FixedWindow::new(0, Duration::from_secs(1), Alignment::FirstRequest).unwrap();
    assert!(never(fw.decide(Default::default(), now, 0).1));
    let log = SlidingLog::new(0, Duration::from_secs(1)).unwrap();
    assert!(never(log.decide(&SlidingLogState::default(), now, 1)));
    let sc = SlidingCounter::new(0, Duration::from_secs(1)).unwrap();
    assert!(never(sc.decide(Default::default(), now, 1).1));

    let zero = Duration::ZERO;
    let message = FixedWindow::new(5, zero, Alignment::FirstRequest)
        .unwrap_err()
        .to_string();
    assert!(message.contains("window is zero"), "{message}");
    assert!(SlidingLog::new(5, zero).is_err());
    assert!(SlidingCounter::new(5, zero).is_err());
    assert!(Rate::new(5, zero).is_err());
    assert!(
        TokenBucket::new(5, zero_rate)
            .unwrap_err()
            .to_string()
            .contains("never refills")
    );
}

#[test]
fn a_cost_above_the_capacity_can_never_pass() {
    let now = Timestamp::from_secs(10);
    let bucket = TokenBucket::new(4, Rate::per_second(4)).unwrap();
    let (_, d) = bucket.decide(bucket.initial(now), now, 5);
    assert!(d.is_permanent_denial());
    assert_eq!(d.remaining, 4, "nothing was consumed");
    let log = SlidingLog::new(3, Duration::from_secs(1)).unwrap();
    assert!(
        log.decide(&SlidingLogState::default(), now, 4)
            .is_permanent_denial()
    );
}

#[test]
fn a_cost_of_zero_asks_without_consuming() {
    let now = Timestamp::from_secs(10);
    let bucket = TokenBucket::new(2, Rate::per_second(1)).unwrap();
    let state = bucket.initial(now);
    let (after, d) = bucket.decide(state, now, 0);
    assert!(d.allowed);
    assert_eq!((after, d.remaining), (state, 2));
    let (empty, _) = bucket.decide(state, now, 2);
    let (_, d) = bucket.decide(empty, now, 0);
    assert!(
        !d.allowed,
        "a cost-0 check reports that the next request would be refused"
    );
    assert_eq!(d.retry_after, Duration::from_secs(1));
}

#[test]
fn a_daily_window_resets_at_local_midnight() {
    // UTC+3: local midnight is 21:00 UTC.
    let day = Duration::from_secs(86_400);
    let fixed = FixedWindow::new(
        1,
        day,
        Alignment::Clock {
            utc_offset_secs: 3 * 3600,
        },
    )
    .unwrap();
    let t = Timestamp::from_secs(20 * 86_400 + 20 * 3600); // 20:00 UTC, 23:00 local
    let (state, d) = fixed.decide(Default::default(), t, 1);
    assert!(d.allowed);
    assert_eq!(state.start, Timestamp::from_secs(19 * 86_400 + 21 * 3600));
    assert_eq!(d.reset_after, Duration::from_secs(3600));
    let (_, refused) = fixed.decide(state, t.saturating_add(Duration::from_secs(3599)), 1);
    assert!(!refused.allowed);
    let (_, next_day) = fixed.decide(state, t.saturating_add(Duration::from_secs(3600)), 1);
    assert!(next_day.allowed);
}

#[test]
fn leaky_queue_delays_then_rejects() {
    // 1 per second, 2 may wait, none longer than 5s: like nginx `rate=1r/s burst=2`.
    let queue = LeakyQueue::new(Rate::per_second(1), 2, Duration::from_secs(5)).unwrap();
    let now = Timestamp::from_secs(100);
    let mut next = Timestamp::EPOCH;
    let mut delays = Vec::new();
    for _ in 0..4 {
        let (after, d) = queue.decide(next, now, 1);
        if d.allowed {
            next = after;
            delays.push(d.delay.as_secs());
        } else {
            assert_eq!(d.retry_after, Duration::from_secs(1));
        }
    }
    assert_eq!(
        delays,
        vec![0, 1, 2],
        "one now, two queued, the fourth rejected"
    );
}

#[test]
fn a_gcra_burst_spanning_centuries_is_refused_when_built() {
    let hourly = Rate::new(1, Duration::from_secs(3600)).unwrap();
    let err = Gcra::new(hourly, 10_000_000).unwrap_err().to_string();
    assert!(err.contains("century"), "{err}");
    assert!(Gcra::new(hourly, 800_000).is_ok(), "91 years is allowed");
}
