//! The worked examples of the classic rate-limiter write-ups, each as a test.

use std::time::Duration;

use sluice_core::{
    Alignment, Check, Clock, FakeClock, FixedWindow, MemoryStore, Policy, Rate, SlidingCounter,
    SlidingCounterState, SlidingLog, SlidingLogState, Timestamp, TokenBucket,
};

const MINUTE: Duration = Duration::from_secs(60);

/// `h:mm:ss` on the first day after the epoch.
fn at(h: u64, m: u64, s: u64) -> Timestamp {
    Timestamp::from_secs(h * 3600 + m * 60 + s)
}

#[test]
fn sliding_log_two_per_minute() {
    // Limit 2 per minute: 1:00:01 and 1:00:30 pass, 1:00:50 is refused, and by 1:01:40 both
    // earlier requests have left the window, so it passes.
    let log = SlidingLog::new(2, MINUTE).unwrap();
    let mut state = SlidingLogState::default();
    let mut request = |t: Timestamp| {
        let d = log.decide(&state, t, 1);
        if d.allowed {
            log.record(&mut state, t, 1);
        }
        d
    };
    assert!(request(at(1, 0, 1)).allowed);
    assert!(request(at(1, 0, 30)).allowed);
    let refused = request(at(1, 0, 50));
    assert!(!refused.allowed);
    assert_eq!(refused.remaining, 0);
    // The 1:00:01 request leaves the window at 1:01:01.
    assert_eq!(refused.retry_after, Duration::from_secs(11));
    assert!(request(at(1, 1, 40)).allowed);
    // Only admitted requests are logged, and expired ones are dropped.
    assert_eq!(state.len(), 1);
}

#[test]
fn sliding_counter_weighted_estimate() {
    // Limit 7 per minute; 5 requests in the previous minute, 3 in the current one, and a request
    // 30% into it: 3 + 5 × 0.7 = 6.5, rounded down to 6, so it passes. The next one does not.
    let counter = SlidingCounter::new(7, MINUTE).unwrap();
    let state = SlidingCounterState {
        start: at(0, 1, 0),
        current: 3,
        previous: 5,
    };
    let now = at(0, 1, 18);
    assert_eq!(counter.estimate(state, now), 6);
    let (state, first) = counter.decide(state, now, 1);
    assert!(first.allowed);
    assert_eq!(first.remaining, 0);
    let (_, second) = counter.decide(state, now, 1);
    assert!(!second.allowed);
    // 4 + 5·(60−e)/60 rounded down ≤ 6 once 5·(60−e) < 180, that is after e = 24s: 6s more.
    assert_eq!(
        second.retry_after,
        Duration::from_secs(6) + Duration::from_nanos(1)
    );
}

#[test]
fn fixed_window_lets_twice_the_limit_through_across_a_boundary() {
    // 5 per minute, reset on the minute: 5 requests in the second half of 2:00 and 5 in the first
    // half of 2:01 all pass, so 10 pass between 2:00:30 and 2:01:30.
    let clock = FakeClock::at(at(2, 0, 30));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let policy =
        Policy::from(FixedWindow::new(5, MINUTE, Alignment::Clock { utc_offset_secs: 0 }).unwrap());
    let check = Check::new("client", &policy, 1);
    let mut admitted = Vec::new();
    for start in [at(2, 0, 30), at(2, 1, 0)] {
        clock.set(start);
        for _ in 0..6 {
            if store.check_one(check).unwrap().allowed {
                admitted.push(clock.now());
            }
            clock.advance(Duration::from_secs(4));
        }
    }
    assert_eq!(admitted.len(), 10);
    assert!(
        admitted
            .iter()
            .all(|t| (at(2, 0, 30)..at(2, 1, 30)).contains(t))
    );
    assert_eq!(
        admitted[4],
        at(2, 0, 46),
        "the sixth request in 2:00 was refused"
    );
}

#[test]
fn token_bucket_of_four_refilled_four_per_minute() {
    let bucket = TokenBucket::new(4, Rate::per_minute(4)).unwrap();
    let mut state = bucket.initial(at(1, 0, 0));
    let mut request = |t: Timestamp| {
        let (next, d) = bucket.decide(state, t, 1);
        if d.allowed {
            state = next;
        }
        d
    };
    // A full bucket: four requests pass at once, the fifth finds it empty.
    for left in (0..4).rev() {
        let d = request(at(1, 0, 0));
        assert!(d.allowed);
        assert_eq!(d.remaining, left);
    }
    let empty = request(at(1, 0, 5));
    assert!(!empty.allowed);
    assert_eq!(
        empty.retry_after,
        Duration::from_secs(10),
        "one token per 15s"
    );
    // At 1:00:15 one token is back; by 1:01:00 the bucket holds four again, and no more.
    assert!(request(at(1, 0, 15)).allowed);
    assert!(!request(at(1, 0, 16)).allowed);
    for _ in 0..4 {
        assert!(request(at(1, 1, 15)).allowed);
    }
    assert!(!request(at(1, 1, 15)).allowed);
    let refilled = request(at(1, 5, 0));
    assert!(refilled.allowed);
    assert_eq!(
        refilled.remaining, 3,
        "the bucket never holds more than its capacity"
    );
}
