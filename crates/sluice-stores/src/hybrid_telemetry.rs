//! The hybrid store's health and series, as the engine takes them through [`StoreTelemetry`]:
//! the Redis store's under it (breaker, refunds), then its own: sync lag, units and keys not yet
//! synced, keys in the negative cache, the over-admission the syncs found, failed syncs, units
//! dropped, live instances.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sluice_core::BreakerState;
use sluice_hybrid::HybridStore;
use sluice_limiter::StoreTelemetry;

use crate::redis_telemetry::RedisTelemetry;
use crate::registered;

/// The hybrid store's own series, once registered.
struct HybridSeries {
    sync_lag: Gauge<f64, AtomicU64>,
    pending_units: Gauge,
    pending_keys: Gauge,
    negative_cached: Gauge,
    over_admitted: Counter<u64, AtomicU64>,
    sync_failures: Counter<u64, AtomicU64>,
    dropped_units: Counter<u64, AtomicU64>,
    instances: Gauge,
}

/// A hybrid store's telemetry: the breaker and series of the Redis store it syncs to, and its
/// own series refreshed from [`HybridStore::stats`] when `/metrics` renders.
pub struct HybridTelemetry {
    redis: RedisTelemetry,
    store: HybridStore,
    series: OnceLock<HybridSeries>,
}

impl std::fmt::Debug for HybridTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridTelemetry")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl HybridTelemetry {
    /// The telemetry of `store` and of the Redis store it syncs to.
    pub fn new(store: HybridStore) -> Self {
        HybridTelemetry {
            redis: RedisTelemetry::new(store.redis().clone()),
            store,
            series: OnceLock::new(),
        }
    }
}

impl StoreTelemetry for HybridTelemetry {
    fn breaker(&self) -> Option<BreakerState> {
        self.redis.breaker()
    }

    /// Registers the Redis store's series, then sync lag, units and keys not yet synced, keys in
    /// the negative cache, and the over-admission the syncs found.
    fn register(&self, registry: &mut Registry) {
        self.redis.register(registry);
        self.series.get_or_init(|| HybridSeries {
            sync_lag: registered(
                registry,
                "hybrid_sync_lag_seconds",
                "Time since the hybrid store's last successful sync with Redis",
                Gauge::default(),
            ),
            pending_units: registered(
                registry,
                "hybrid_pending_units",
                "Units admitted locally and not yet synced to Redis",
                Gauge::default(),
            ),
            pending_keys: registered(
                registry,
                "hybrid_pending_keys",
                "Keys with units not yet synced to Redis",
                Gauge::default(),
            ),
            negative_cached: registered(
                registry,
                "hybrid_negative_cached_keys",
                "Keys known over their limit, answered locally without Redis until their reset",
                Gauge::default(),
            ),
            over_admitted: registered(
                registry,
                "hybrid_over_admitted_units",
                "Estimate of units admitted over their limits, as the syncs found the global counts",
                Counter::default(),
            ),
            sync_failures: registered(
                registry,
                "hybrid_sync_failures",
                "Syncs that failed; their units were kept for the next",
                Counter::default(),
            ),
            dropped_units: registered(
                registry,
                "hybrid_dropped_units",
                "Units dropped unsynced because their window ended while Redis was away",
                Counter::default(),
            ),
            instances: registered(
                registry,
                "hybrid_instances",
                "Live hybrid instances on this Redis and prefix, each taking its share",
                Gauge::default(),
            ),
        });
    }

    fn refresh(&self) {
        self.redis.refresh();
        let Some(series) = self.series.get() else {
            return;
        };
        let stats = self.store.stats();
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        series.sync_lag.set(stats.sync_lag.as_secs_f64());
        series.pending_units.set(gauge(stats.pending_units));
        series.pending_keys.set(gauge(stats.pending_keys as u64));
        series
            .negative_cached
            .set(gauge(stats.negative_cached as u64));
        series.instances.set(gauge(stats.instances));
        series
            .over_admitted
            .inner()
            .store(stats.over_admitted, Ordering::Relaxed);
        series
            .sync_failures
            .inner()
            .store(stats.sync_failures, Ordering::Relaxed);
        series
            .dropped_units
            .inner()
            .store(stats.dropped_units, Ordering::Relaxed);
    }
}
