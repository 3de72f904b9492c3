//! The Redis store's health and series, as the engine takes them through
//! [`StoreTelemetry`]: its breaker for `/readyz`, and in `/metrics` the breaker's state, calls it
//! short-circuited, and multi-slot refunds.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sluice_core::BreakerState;
use sluice_limiter::StoreTelemetry;
use sluice_redis::{RedisStats, RedisStore};

use crate::registered;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BreakerLabels {
    state: &'static str,
}

/// The Redis store's series, once registered.
struct RedisSeries {
    breaker: Family<BreakerLabels, Gauge>,
    short_circuited: Counter<u64, AtomicU64>,
    refunds: Counter<u64, AtomicU64>,
    refund_failures: Counter<u64, AtomicU64>,
}

/// A Redis store's telemetry: its breaker, and its series refreshed from
/// [`RedisStore::stats`] when `/metrics` renders.
pub struct RedisTelemetry {
    store: RedisStore,
    series: OnceLock<RedisSeries>,
}

impl std::fmt::Debug for RedisTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTelemetry")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl RedisTelemetry {
    /// The telemetry of `store` (a clone shares its breaker and statistics).
    pub fn new(store: RedisStore) -> Self {
        RedisTelemetry {
            store,
            series: OnceLock::new(),
        }
    }

    /// Sets the series from `stats`.
    fn show(&self, stats: &RedisStats) {
        let Some(series) = self.series.get() else {
            return;
        };
        for state in BreakerState::ALL {
            series
                .breaker
                .get_or_create(&BreakerLabels {
                    state: state.name(),
                })
                .set(i64::from(state == stats.breaker));
        }
        series
            .short_circuited
            .inner()
            .store(stats.short_circuited, Ordering::Relaxed);
        series
            .refunds
            .inner()
            .store(stats.refunds, Ordering::Relaxed);
        series
            .refund_failures
            .inner()
            .store(stats.refund_failures, Ordering::Relaxed);
    }
}

impl StoreTelemetry for RedisTelemetry {
    fn breaker(&self) -> Option<BreakerState> {
        Some(self.store.breaker_state())
    }

    /// Registers the breaker state, calls short-circuited by the breaker, and multi-slot
    /// refunds.
    fn register(&self, registry: &mut Registry) {
        self.series.get_or_init(|| RedisSeries {
            breaker: registered(
                registry,
                "store_breaker_state",
                "The Redis circuit breaker's state (1 for the current one)",
                Family::default(),
            ),
            short_circuited: registered(
                registry,
                "store_short_circuited",
                "Store calls failed at once because the breaker was open",
                Counter::default(),
            ),
            refunds: registered(
                registry,
                "store_refunds",
                "Requests whose checks spanned Cluster slots and were refunded",
                Counter::default(),
            ),
            refund_failures: registered(
                registry,
                "store_refund_failures",
                "Refunds that failed, leaving a reservation to expire",
                Counter::default(),
            ),
        });
    }

    fn refresh(&self) {
        self.show(&self.store.stats());
    }
}
