//! A reservation while the store fails: each limit's `on_store_error` decides, and an admitted
//! request holds no reservation. The answer says so (`store_failed`), so that no front end hands
//! a client a bare `null` to settle.

use std::sync::Arc;

use sluice_core::{Check, Decision, Lease, Policy, Store, StoreError, StoreResult};
use sluice_limiter::{LimitRequest, Limiter, Metrics, RequestDescriptor};
use sluice_rules::Reloader;

/// A store that is away: every call fails as a transient outage does.
struct Away;

fn away<T>() -> StoreResult<T> {
    Err(StoreError::Unavailable("away".into()))
}

impl Store for Away {
    async fn check(&self, _checks: &[Check<'_>]) -> StoreResult<Vec<Decision>> {
        away()
    }

    async fn peek(&self, _key: &str, _policy: &Policy) -> StoreResult<Decision> {
        away()
    }

    async fn reset(&self, _key: &str) -> StoreResult<bool> {
        away()
    }

    async fn reserve(
        &self,
        _checks: &[Check<'_>],
        _lease: Lease<'_>,
    ) -> StoreResult<Vec<Decision>> {
        away()
    }
}

async fn reserve(on_store_error: &str) -> sluice_limiter::Reserved {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yaml");
    let rules = format!(
        "domain: d\non_store_error: {on_store_error}\ndescriptors:\n  - key: k\n    \
         rate_limit: {{unit: hour, requests_per_unit: 1000}}\n"
    );
    std::fs::write(&path, rules).unwrap();
    let limiter = Limiter::new(
        Reloader::new(vec![path]).unwrap(),
        Arc::new(Away),
        Arc::new(Metrics::new()),
    );
    let request = LimitRequest {
        domain: "d".into(),
        descriptors: vec![RequestDescriptor::new([("k", "v")])],
        cost: 1,
    };
    limiter.reserve(&request, 100, None).await.unwrap()
}

#[tokio::test]
async fn admitted_without_the_store_holds_no_reservation_and_says_so() {
    let allowed = reserve("allow").await;
    assert!(allowed.verdict.allowed);
    assert!(allowed.reservation.is_none());
    assert!(allowed.store_failed);
    let denied = reserve("deny").await;
    assert!(!denied.verdict.allowed);
    assert!(denied.store_failed);
}
