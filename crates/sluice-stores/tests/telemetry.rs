//! Each store reports its own health and series to the engine through its telemetry: a Redis
//! store's breaker reaches `/readyz`'s question and its series follow the engine's in
//! `/metrics`; a hybrid store adds its own after the Redis store's; a memory store adds none.

use std::sync::Arc;

use sluice_limiter::{BreakerState, Limiter, Metrics};
use sluice_redis::testing::shared_server;
use sluice_rules::{Reloader, RuleSet};
use sluice_stores::{StoreSettings, open};

/// A limiter over the store `url` names, with no rules.
async fn limiter_on(url: &str) -> Limiter {
    let settings = StoreSettings {
        prefix: sluice_redis::testing::unique_prefix(),
        ..StoreSettings::default()
    };
    let opened = open(url, &settings).await.unwrap();
    let rules = RuleSet::parse("rules.yaml", "domain: api\ndescriptors: []\n").unwrap();
    Limiter::with_open_store(Reloader::fixed(rules), opened, Arc::new(Metrics::new()))
}

/// Where `line` is in `text`, or a panic naming it.
fn at(text: &str, line: &str) -> usize {
    text.find(line)
        .unwrap_or_else(|| panic!("no `{line}` in:\n{text}"))
}

#[tokio::test]
async fn a_redis_store_reports_its_breaker_and_its_series_after_the_engines() {
    let limiter = limiter_on(&shared_server().url()).await;
    assert_eq!(limiter.breaker(), Some(BreakerState::Closed));
    let text = limiter.render_metrics();
    let build = at(&text, "# HELP sluice_build_info The running build.");
    let breaker = at(
        &text,
        "# HELP sluice_store_breaker_state The Redis circuit breaker's state (1 for the current one).",
    );
    assert!(build < breaker);
    at(&text, "sluice_store_breaker_state{state=\"closed\"} 1");
    at(&text, "sluice_store_breaker_state{state=\"open\"} 0");
    at(&text, "sluice_store_breaker_state{state=\"half_open\"} 0");
    at(&text, "sluice_store_refund_failures_total 0");
    assert!(!text.contains("sluice_hybrid_"), "{text}");
}

#[tokio::test]
async fn a_hybrid_store_reports_the_redis_series_then_its_own() {
    let url = format!("hybrid+{}", shared_server().url());
    let limiter = limiter_on(&url).await;
    assert_eq!(limiter.breaker(), Some(BreakerState::Closed));
    let text = limiter.render_metrics();
    let redis = at(&text, "# TYPE sluice_store_refund_failures counter");
    let hybrid = at(&text, "# TYPE sluice_hybrid_sync_lag_seconds gauge");
    assert!(redis < hybrid);
    at(&text, "sluice_hybrid_pending_units 0");
    at(&text, "sluice_hybrid_instances ");
}

#[tokio::test]
async fn a_memory_store_has_no_breaker_and_no_series_of_its_own() {
    let limiter = limiter_on("memory").await;
    assert_eq!(limiter.breaker(), None);
    let text = limiter.render_metrics();
    for series in [
        "sluice_store_breaker_state",
        "sluice_store_refunds",
        "sluice_hybrid_",
    ] {
        assert!(!text.contains(series), "{series} in:\n{text}");
    }
}
