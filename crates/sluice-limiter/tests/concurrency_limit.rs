//! A concurrency limit through the engine: a decision without a reservation only asks whether a
//! slot is free, a reservation takes one slot whatever its amount (beside the amount it takes
//! from a budget), its settle releases it, and a reservation never outlives the slot's ttl.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{FakeClock, MemoryStore, Timestamp};
use sluice_limiter::{HeaderStyle, LimitRequest, Limiter, Metrics, RequestDescriptor};
use sluice_rules::Reloader;

const RULES: &str = "domain: llm
descriptors:
  - key: tenant
    limits:
      - {name: tokens, unit: hour, requests_per_unit: 1000}
      - {name: in_flight, concurrency: 2, ttl: 1m}
";

fn limiter() -> (Limiter, FakeClock, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, RULES).unwrap();
    let clock = FakeClock::at(Timestamp::from_secs(1_700_000_040));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let limiter = Limiter::new(
        Reloader::new(vec![path]).unwrap(),
        Arc::new(store),
        Arc::new(Metrics::new()),
    );
    (limiter, clock, dir)
}

fn request() -> LimitRequest {
    LimitRequest {
        domain: "llm".into(),
        descriptors: vec![RequestDescriptor::new([("tenant", "acme")])],
        cost: 1,
    }
}

fn header(verdict: &sluice_limiter::Verdict, name: &str) -> Option<String> {
    verdict
        .headers(HeaderStyle::Both)
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.to_str().unwrap().to_owned())
}

#[tokio::test]
async fn a_reservation_holds_one_slot_until_its_settle() {
    let (limiter, _, _dir) = limiter();
    // Checks take no slot: nothing could release it.
    for _ in 0..3 {
        let verdict = limiter.decide(&request()).await.unwrap();
        assert!(verdict.allowed);
    }
    let first = limiter.reserve(&request(), 300, None).await.unwrap();
    let second = limiter.reserve(&request(), 300, None).await.unwrap();
    let (first, second) = (first.reservation.unwrap(), second.reservation.unwrap());
    let refused = limiter.reserve(&request(), 10, None).await.unwrap();
    assert!(!refused.verdict.allowed);
    assert!(refused.reservation.is_none());
    let policy = header(&refused.verdict, "ratelimit-policy").unwrap();
    assert!(
        policy.contains(r#""in_flight";q=2;qu="concurrent-requests""#),
        "{policy}"
    );
    assert_eq!(
        header(&refused.verdict, "retry-after").as_deref(),
        Some("1")
    );
    // A check now says no slot is free, and still takes none.
    assert!(!limiter.decide(&request()).await.unwrap().allowed);
    // The first ends having used 100 of its 300 tokens: 200 back, and its slot released.
    let settled = limiter.settle(&first, 100).await.unwrap();
    assert!(matches!(
        settled,
        sluice_core::Settlement::Settled { refunded: 200, .. }
    ));
    let third = limiter.reserve(&request(), 300, None).await.unwrap();
    assert!(third.verdict.allowed, "a slot came back");
    let tokens = header(&third.verdict, "ratelimit").unwrap();
    // 1000, less the three checks, the second's 300, the first's 100 used and the third's 300.
    assert!(tokens.contains(r#""tokens";r=297"#), "{tokens}");
    limiter.settle(&second, 0).await.unwrap();
}

#[tokio::test]
async fn a_reservation_never_outlives_its_slot() {
    let (limiter, clock, _dir) = limiter();
    let reserved = limiter
        .reserve(&request(), 10, Some(Duration::from_secs(600)))
        .await
        .unwrap();
    assert_eq!(reserved.ttl, Duration::from_secs(60));
    let lost = reserved.reservation.unwrap();
    limiter.reserve(&request(), 10, None).await.unwrap();
    assert!(
        !limiter
            .reserve(&request(), 10, None)
            .await
            .unwrap()
            .verdict
            .allowed
    );
    // Neither is settled: a minute on, both slots are back, and the reservations expired.
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        limiter.settle(&lost, 0).await.unwrap(),
        sluice_core::Settlement::Expired
    );
    let again = limiter.reserve(&request(), 10, None).await.unwrap();
    assert!(again.verdict.allowed);
}
