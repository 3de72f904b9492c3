//! The backend suite: one set of behavioural tests that every [`Store`] must pass, written once
//! and run against each backend (memory, Redis, Redis Cluster, hybrid) by [`backend_suite!`].
//!
//! A backend crate provides a [`Backend`]: a store plus a way to move its clock, then calls the
//! macro in an integration test:
//!
//! ```text
//! async fn memory() -> MyBackend { ... }
//! sluice_core::backend_suite!(memory());
//! ```

use std::sync::Arc;
use std::time::Duration;

use crate::{
    Alignment, BucketedWindow, Check, ConcurrencyLimit, Decision, FixedWindow, Gcra, LeakyQueue,
    Policy, Rate, SlidingCounter, SlidingLog, Store, TokenBucket,
};

/// A store under test, with control over the time it decides on.
pub trait Backend: Send + Sync + 'static {
    /// The store.
    type Store: Store;

    /// The store under test.
    fn store(&self) -> &Self::Store;

    /// Moves the store's notion of now forward by `d`.
    fn advance(&self, d: Duration);
}

/// One policy per algorithm, each admitting 5 requests at once and refilling over a second.
pub fn five_per_second() -> Vec<Policy> {
    let second = Duration::from_secs(1);
    let rate = Rate::per_second(5);
    vec![
        TokenBucket::new(5, rate).map(Policy::from),
        Gcra::new(rate, 5).map(Policy::from),
        LeakyQueue::new(rate, 4, Duration::from_secs(10)).map(Policy::from),
        FixedWindow::new(5, second, Alignment::FirstRequest).map(Policy::from),
        SlidingLog::new(5, second).map(Policy::from),
        SlidingCounter::new(5, second).map(Policy::from),
        BucketedWindow::new(5, second, 5).map(Policy::from),
        // Holds that expire after a second, when no settle releases them.
        ConcurrencyLimit::new(5, second).map(Policy::from),
    ]
    .into_iter()
    .map(|p| p.expect("valid policy"))
    .collect()
}

/// [`five_per_second`], less the policies the backend's store says it cannot hold: each store is
/// held to the suite for every algorithm it accepts, and refuses the rest when rules load.
fn supported<B: Backend>(b: &B) -> Vec<Policy> {
    five_per_second()
        .into_iter()
        .filter(|p| b.store().supports(p).is_ok())
        .collect()
}

/// A key unique to one test and policy, so tests sharing a backend do not interfere.
fn key(test: &str, p: &Policy) -> String {
    format!("suite:{test}:{}", p.algorithm())
}

async fn one<B: Backend>(b: &B, key: &str, policy: &Policy, cost: u64) -> Decision {
    let decisions = b
        .store()
        .check(&[Check::new(key, policy, cost)])
        .await
        .expect("store answers");
    assert_eq!(decisions.len(), 1);
    decisions[0]
}

/// A burst gets exactly the limit through, then is refused with a retry time that works.
pub async fn burst_admits_exactly_the_limit<B: Backend>(b: &B) {
    for p in supported(b) {
        let k = key("burst", &p);
        let mut admitted = 0;
        let mut refusal = None;
        for _ in 0..8 {
            let d = one(b, &k, &p, 1).await;
            assert_eq!(d.limit, 5, "{}", p.algorithm());
            if d.allowed {
                admitted += 1;
                assert_eq!(d.remaining, 5 - admitted, "{}", p.algorithm());
            } else {
                refusal = Some(d);
            }
        }
        assert_eq!(admitted, 5, "{}", p.algorithm());
        let refusal = refusal.expect("a refusal");
        assert_eq!(refusal.remaining, 0, "{}", p.algorithm());
        assert!(refusal.retry_after > Duration::ZERO, "{}", p.algorithm());
        assert!(
            refusal.retry_after <= Duration::from_secs(2),
            "{}",
            p.algorithm()
        );
        b.advance(refusal.retry_after);
        assert!(
            one(b, &k, &p, 1).await.allowed,
            "{} after retry_after",
            p.algorithm()
        );
    }
}

/// After long enough idle, a counter is full again.
pub async fn idle_counters_refill<B: Backend>(b: &B) {
    for p in supported(b) {
        let k = key("refill", &p);
        for _ in 0..5 {
            assert!(one(b, &k, &p, 1).await.allowed, "{}", p.algorithm());
        }
        b.advance(Duration::from_secs(3));
        let d = one(b, &k, &p, 1).await;
        assert!(d.allowed, "{}", p.algorithm());
        assert_eq!(d.remaining, 4, "{}", p.algorithm());
    }
}

/// Costs above 1 take that many units; a cost of 0 takes none; a cost above the capacity can
/// never pass and takes nothing.
pub async fn costs_are_counted<B: Backend>(b: &B) {
    // Every algorithm whose table entry says it takes costs of 0 and above 1.
    let takes_costs = |p: &Policy| {
        let costs = p.algorithm().spec().costs;
        costs.zero && costs.many
    };
    for p in supported(b).into_iter().filter(takes_costs) {
        let k = key("cost", &p);
        let d = one(b, &k, &p, 3).await;
        assert!(d.allowed, "{}", p.algorithm());
        assert_eq!(d.remaining, 2, "{}", p.algorithm());
        let d = one(b, &k, &p, 0).await;
        assert!(d.allowed, "{}", p.algorithm());
        assert_eq!(d.remaining, 2, "{} cost 0 consumes nothing", p.algorithm());
        let d = one(b, &k, &p, 6).await;
        assert!(d.is_permanent_denial(), "{}", p.algorithm());
        let d = one(b, &k, &p, 3).await;
        assert!(!d.allowed, "{}", p.algorithm());
        assert!(!d.is_permanent_denial(), "{}", p.algorithm());
        let d = one(b, &k, &p, 2).await;
        assert!(d.allowed, "{} refusals consumed nothing", p.algorithm());
        assert_eq!(d.remaining, 0, "{}", p.algorithm());
    }
}

/// A limit of 0 blocks every request, permanently.
pub async fn zero_limit_blocks<B: Backend>(b: &B) {
    let day = Duration::from_secs(86_400);
    let blocked = [
        Policy::from(FixedWindow::new(0, day, Alignment::Clock { utc_offset_secs: 0 }).unwrap()),
        Policy::from(TokenBucket::new(0, Rate::per_second(0)).unwrap()),
        Policy::from(SlidingCounter::new(0, day).unwrap()),
    ];
    for p in blocked
        .into_iter()
        .filter(|p| b.store().supports(p).is_ok())
    {
        let d = one(b, &key("zero", &p), &p, 1).await;
        assert!(d.is_permanent_denial(), "{}", p.algorithm());
        assert_eq!((d.limit, d.remaining), (0, 0));
    }
}

/// Checks of one request are all-or-nothing: when one limit refuses, no counter consumes.
pub async fn multi_checks_are_all_or_nothing<B: Backend>(b: &B) {
    let second = TokenBucket::new(2, Rate::per_second(2)).unwrap().into();
    let day: Policy = FixedWindow::new(10, Duration::from_secs(86_400), Alignment::FirstRequest)
        .unwrap()
        .into();
    let checks = [
        Check::new("suite:atomic:second", &second, 1),
        Check::new("suite:atomic:day", &day, 1),
    ];
    for expected in [true, true, false, false, false] {
        let ds = b.store().check(&checks).await.unwrap();
        assert_eq!(ds.len(), 2);
        assert_eq!(ds[0].allowed, expected);
        assert!(ds[1].allowed, "the daily limit alone would admit");
        if !expected {
            assert_eq!(
                ds[1].remaining, 8,
                "a refused request reports the day as it stands"
            );
        }
    }
    // The three refused requests did not burn the daily quota.
    let d = one(b, "suite:atomic:day", &day, 0).await;
    assert_eq!(d.remaining, 8);
    b.advance(Duration::from_secs(1));
    let ds = b.store().check(&checks).await.unwrap();
    assert!(ds.iter().all(|d| d.allowed));
    assert_eq!(ds[1].remaining, 7);
}

/// A key that appears twice in one request is charged twice, and the request is still
/// all-or-nothing.
pub async fn repeated_keys_in_one_request<B: Backend>(b: &B) {
    let mut p: Policy = SlidingLog::new(3, Duration::from_secs(60)).unwrap().into();
    if b.store().supports(&p).is_err() {
        p = FixedWindow::new(3, Duration::from_secs(60), Alignment::FirstRequest)
            .unwrap()
            .into();
    }
    let twice = [
        Check::new("suite:repeat", &p, 1),
        Check::new("suite:repeat", &p, 1),
    ];
    let ds = b.store().check(&twice).await.unwrap();
    assert!(ds.iter().all(|d| d.allowed));
    assert_eq!((ds[0].remaining, ds[1].remaining), (2, 1));
    let ds = b.store().check(&twice).await.unwrap();
    assert_eq!((ds[0].allowed, ds[1].allowed), (true, false));
    assert_eq!(one(b, "suite:repeat", &p, 0).await.remaining, 1);
}

/// Peeking creates and consumes nothing; resetting a counter makes it full again.
pub async fn peek_and_reset<B: Backend>(b: &B) {
    for p in supported(b) {
        let k = key("peek", &p);
        let d = b.store().peek(&k, &p).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, 5, "{}", p.algorithm());
        for _ in 0..5 {
            one(b, &k, &p, 1).await;
        }
        let d = b.store().peek(&k, &p).await.unwrap();
        assert!(!d.allowed, "{}", p.algorithm());
        assert_eq!(d.remaining, 0, "{}", p.algorithm());
        assert!(b.store().reset(&k).await.unwrap(), "{}", p.algorithm());
        assert_eq!(one(b, &k, &p, 1).await.remaining, 4, "{}", p.algorithm());
        assert!(!b.store().reset(&key("never-used", &p)).await.unwrap());
    }
}

/// Different keys are different counters.
pub async fn keys_are_independent<B: Backend>(b: &B) {
    let p: Policy = Gcra::new(Rate::per_second(1), 1).unwrap().into();
    assert!(one(b, "suite:independent:a", &p, 1).await.allowed);
    assert!(!one(b, "suite:independent:a", &p, 1).await.allowed);
    assert!(one(b, "suite:independent:b", &p, 1).await.allowed);
    assert!(one(b, "suite:independent:a|b", &p, 1).await.allowed);
}

/// Many concurrent requests on one key get exactly the limit through, alone and as part of
/// multi-key requests.
pub async fn concurrent_requests_are_exact<B: Backend>(b: Arc<B>) {
    for p in supported(&*b) {
        let p = match p {
            // Give each algorithm a limit of 50 for 200 concurrent requests.
            Policy::LeakyQueue(_) => {
                LeakyQueue::new(Rate::per_second(5), 49, Duration::from_secs(60))
                    .unwrap()
                    .into()
            }
            Policy::TokenBucket(_) => TokenBucket::new(50, Rate::per_second(5)).unwrap().into(),
            Policy::Gcra(_) => Gcra::new(Rate::per_second(5), 50).unwrap().into(),
            Policy::FixedWindow(_) => {
                FixedWindow::new(50, Duration::from_secs(60), Alignment::FirstRequest)
                    .unwrap()
                    .into()
            }
            Policy::SlidingLog(_) => SlidingLog::new(50, Duration::from_secs(60)).unwrap().into(),
            Policy::SlidingCounter(_) => SlidingCounter::new(50, Duration::from_secs(60))
                .unwrap()
                .into(),
            Policy::BucketedWindow(_) => BucketedWindow::new(50, Duration::from_secs(60), 6)
                .unwrap()
                .into(),
            Policy::ConcurrencyLimit(_) => ConcurrencyLimit::new(50, Duration::from_secs(60))
                .unwrap()
                .into(),
        };
        let p = Arc::new(p);
        let hot = key("concurrent", &p);
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let (b, p, hot) = (b.clone(), p.clone(), hot.clone());
                tokio::spawn(async move {
                    let own = format!("{hot}:{i}");
                    let checks = [Check::new(&own, &p, 1), Check::new(&hot, &p, 1)];
                    let ds = b.store().check(&checks[i % 2..]).await.unwrap();
                    ds.iter().all(|d| d.allowed)
                })
            })
            .collect();
        let mut admitted = 0;
        for t in tasks {
            admitted += u32::from(t.await.unwrap());
        }
        assert_eq!(admitted, 50, "{}", p.algorithm());
    }
}

/// Generates one `#[tokio::test]` per suite case for the backend that `$make` (an expression
/// evaluating to a future of a [`Backend`]) builds afresh for each test.
#[macro_export]
macro_rules! backend_suite {
    ($make:expr) => {
        $crate::backend_suite!(@cases $make;
            burst_admits_exactly_the_limit,
            idle_counters_refill,
            costs_are_counted,
            zero_limit_blocks,
            multi_checks_are_all_or_nothing,
            repeated_keys_in_one_request,
            peek_and_reset,
            keys_are_independent,
        );
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_requests_are_exact() {
            let backend = ::std::sync::Arc::new($make.await);
            $crate::testing::concurrent_requests_are_exact(backend).await;
        }
    };
    (@cases $make:expr; $($case:ident,)*) => {
        $(
            #[tokio::test]
            async fn $case() {
                let backend = $make.await;
                $crate::testing::$case(&backend).await;
            }
        )*
    };
}
