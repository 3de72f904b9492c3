//! The one decision path every front end ends in: descriptors → rules → checks → store →
//! verdict, with fallback on store errors and metrics.
//!
//! `Limiter::decide` takes three steps, each in its own file: the plan (`limiter/plan.rs`), the
//! checks a request makes, each a counter key, a cost and the [`Rule`](sluice_rules::Rule)
//! that limits it; the check (`limiter/check.rs`, with Envoy's `hits_addend` counting in
//! `limiter/envoy_hits.rs`), the store's answer to each; and the verdict
//! (`limiter/assemble.rs`), each limit's result counted in the metrics
//! (`limiter/rule_counters.rs` keeps each rule's counters).

mod assemble;
mod check;
mod envoy_hits;
mod plan;
mod refund;
mod reserve;
mod rule_counters;

pub use reserve::{InvalidReservation, ReservationTtls, Reserved, SettleRefused, Settled};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sluice_core::{DynStore, MemoryStore};
use sluice_rules::Reloader;

use crate::activity::{DecisionHistory, ReloadLog};
use crate::metrics::{Metrics, Snapshot};
use crate::metrics_page::MetricsPages;
use crate::open_store::OpenStore;
use crate::overrides::Overrides;
use crate::request::{InvalidRequest, LimitRequest};
use crate::store_telemetry::StoreTelemetry;
use crate::verdict::Verdict;

use envoy_hits::over_key;
use plan::Plan;
use rule_counters::RuleCounters;

/// The limiter: rules, a store, a local fallback store and metrics.
pub struct Limiter {
    rules: Arc<Reloader>,
    store: Arc<dyn DynStore>,
    /// The store's breaker and its own series, whichever store it is.
    telemetry: Arc<dyn StoreTelemetry>,
    local: MemoryStore,
    metrics: Arc<Metrics>,
    /// Each rule's decision counters, so that counting a decision neither copies nor hashes
    /// its labels.
    counters: RwLock<Option<RuleCounters>>,
    /// The `Retry-After` given by `on_store_error: deny`.
    deny_retry: Duration,
    /// Decision totals over the last minutes, for the dashboard.
    history: DecisionHistory,
    /// The last rule reloads, for the dashboard.
    reloads: Arc<ReloadLog>,
    /// envoyproxy/ratelimit's service-wide `QUOTA_MODE`: every limit is a quota limit.
    quota_mode: AtomicBool,
    /// How long reservations hold.
    reservation_ttls: reserve::Ttls,
    /// The rendered `/metrics` page, shared by the scrapes of one second.
    pages: MetricsPages,
    /// The limits changed at run time, through the admin API.
    overrides: Arc<Overrides>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter").finish_non_exhaustive()
    }
}

impl Limiter {
    /// A limiter over `rules` and `store`.
    pub fn new(rules: Arc<Reloader>, store: Arc<dyn DynStore>, metrics: Arc<Metrics>) -> Self {
        Self::with_open_store(rules, OpenStore::plain(store), metrics)
    }

    /// A limiter over `rules` and an open store (one opened from its URL by `sluice-stores`),
    /// whose health (a Redis store's breaker and refunds, say) it reports in its metrics and
    /// readiness.
    pub fn with_open_store(rules: Arc<Reloader>, opened: OpenStore, metrics: Arc<Metrics>) -> Self {
        metrics.register_store(opened.telemetry.as_ref());
        let reloads = ReloadLog::follow(&rules);
        let overrides = Arc::new(Overrides::new(
            Arc::clone(&rules),
            Arc::clone(&opened.store),
        ));
        metrics.register_with(|registry| overrides.register(registry));
        Limiter {
            rules,
            store: opened.store,
            telemetry: opened.telemetry,
            local: MemoryStore::new(),
            metrics,
            counters: RwLock::new(None),
            deny_retry: Duration::from_secs(1),
            history: DecisionHistory::default(),
            reloads,
            quota_mode: AtomicBool::new(false),
            reservation_ttls: Default::default(),
            pages: MetricsPages::default(),
            overrides,
        }
    }

    /// Makes every limit a quota limit (envoyproxy/ratelimit's `QUOTA_MODE`): a request is
    /// refused only when every descriptor with a limit refuses it.
    pub fn set_quota_mode(&self, on: bool) {
        self.quota_mode.store(on, Ordering::Relaxed);
    }

    /// Decision totals over the last minutes, as [`crate::activity::sample_every`] samples them.
    pub fn history(&self) -> &DecisionHistory {
        &self.history
    }

    /// The last rule reloads, with their errors.
    pub fn reload_log(&self) -> &ReloadLog {
        &self.reloads
    }

    /// The store's circuit breaker, when it has one (Redis and hybrid stores do).
    pub fn breaker(&self) -> Option<sluice_core::BreakerState> {
        self.telemetry.breaker()
    }

    /// The metrics in Prometheus text form, every gauge refreshed from the rules, the store and
    /// the reloader.
    pub fn render_metrics(&self) -> String {
        let stats = self.rules.stats();
        self.telemetry.refresh();
        self.overrides.refresh_metrics();
        self.metrics.render(&Snapshot {
            tracked_keys: self.store.tracked_keys(),
            reloads: stats.reloads.load(Ordering::Relaxed),
            reload_failures: stats.failures.load(Ordering::Relaxed),
        })
    }

    /// The metrics page for a scrape: [`render_metrics`](Self::render_metrics) at most once a
    /// second, shared by the scrapes of that second, or the newest page however old while
    /// clients that do not read their answers hold
    /// [`MAX_PAGES`](crate::metrics_page::MAX_PAGES) pages ([`metrics_page`](crate::metrics_page)).
    pub fn metrics_page(&self) -> bytes::Bytes {
        self.pages.page(|| self.render_metrics())
    }

    /// The limits changed at run time: set, removed and listed through the admin API, shared
    /// by every instance when the store shares them ([`Overrides::follow`]).
    pub fn overrides(&self) -> &Arc<Overrides> {
        &self.overrides
    }

    /// The rules in force.
    pub fn reloader(&self) -> &Arc<Reloader> {
        &self.rules
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn DynStore> {
        &self.store
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Resets the counter `key`, with the usage Envoy-counted reports put past its limit (see
    /// [`crate::RequestDescriptor::envoy_hits`]). Whether there was anything to reset.
    pub async fn reset_counter(&self, key: &str) -> Result<bool, sluice_core::StoreError> {
        let counted = self.store.reset(key).await?;
        let beyond = self.store.reset(&over_key(key)).await?;
        Ok(counted || beyond)
    }

    /// Decides a request. Invalid requests are refused before anything is counted.
    pub async fn decide(&self, request: &LimitRequest) -> Result<Verdict, InvalidRequest> {
        request.validate()?;
        // The time-stamp counter's clock, a few nanoseconds where std's costs about 25 (two
        // readings a decision, for the latency histogram).
        let started = quanta::Instant::now();
        let rules = self.rules.rules();
        let plan = Plan::new(
            &rules,
            request,
            self.quota_mode.load(Ordering::Relaxed),
            &self.overrides,
        );
        let (plan, checked) = if request.descriptors.iter().any(|d| d.refund) {
            // On the heap: a refund's future is large, and most decisions refund nothing.
            Box::pin(self.check_with_refunds(request, plan)).await
        } else {
            let checked = self.check(request, &plan).await;
            (plan, checked)
        };
        let verdict = self.assemble(&rules, request, plan, checked);
        self.metrics.observe_latency(started.elapsed());
        Ok(verdict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Outcome;
    use crate::request::RequestDescriptor;

    fn rules(name: &str) -> String {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{name: {name}, unit: minute, requests_per_unit: 100}}\n"
        )
    }

    fn request() -> LimitRequest {
        LimitRequest {
            domain: "d".into(),
            descriptors: vec![RequestDescriptor {
                entries: vec![("k".into(), "v".into())],
                ..Default::default()
            }],
            cost: 1,
        }
    }

    #[tokio::test]
    async fn decisions_are_counted_on_the_rules_in_force_across_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, rules("first")).unwrap();
        let reloader = Reloader::new(vec![path.clone()]).unwrap();
        let limiter = Limiter::new(
            reloader.clone(),
            Arc::new(MemoryStore::new()),
            Arc::new(Metrics::new()),
        );
        let count = |name| limiter.metrics().decisions_of("d", name, Outcome::Allowed);
        for _ in 0..3 {
            assert!(limiter.decide(&request()).await.unwrap().allowed);
        }
        assert_eq!(count("first"), 3);

        std::fs::write(&path, rules("second")).unwrap();
        reloader.reload_now();
        limiter.decide(&request()).await.unwrap();
        assert_eq!((count("first"), count("second")), (3, 1));

        // Reloaded unchanged, the rule is a new object with the same labels: the same series.
        reloader.reload_now();
        limiter.decide(&request()).await.unwrap();
        assert_eq!((count("first"), count("second")), (3, 2));
    }

    /// A decision's future is copied into its box whole, on every request: the rare paths
    /// (several limits, refunds, the store's fallback) stay on the heap of their own, so that
    /// it stays small (2,048 bytes before; 384 now). A reservation's future too.
    #[test]
    fn a_decisions_future_stays_small() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, rules("small")).unwrap();
        let limiter = Limiter::new(
            Reloader::new(vec![path]).unwrap(),
            Arc::new(MemoryStore::new()),
            Arc::new(Metrics::new()),
        );
        let request = request();
        let decision = limiter.decide(&request);
        assert!(
            std::mem::size_of_val(&decision) <= 512,
            "{} bytes",
            std::mem::size_of_val(&decision)
        );
        // A reservation's likewise: its store failure and its shadow limits on the heap when
        // there are any (880 bytes before).
        let reservation = limiter.reserve(&request, 1, None);
        assert!(
            std::mem::size_of_val(&reservation) <= 512,
            "{} bytes",
            std::mem::size_of_val(&reservation)
        );
    }
}
