//! The Redis store's health and series, as the engine takes them through
//! [`StoreTelemetry`]: its breaker for `/readyz`, and in `/metrics` the breaker's state, calls it
//! short-circuited, and multi-slot refunds.
//!
//! On a Cluster each master has a breaker of its own. The store's breaker is then the worst of
//! them (open while any master's is open, so `/readyz` says a part of the keys falls to
//! `on_store_error`), and `/metrics` also has each master's breaker, short-circuited calls and
//! round trips, labelled with its address; a master that leaves the Cluster's map (a failover)
//! leaves the series too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sluice_core::BreakerState;
use sluice_limiter::StoreTelemetry;
use sluice_redis::{MasterHealth, RedisStats, RedisStore};

use crate::registered;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BreakerLabels {
    state: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct MasterBreakerLabels {
    master: String,
    state: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct MasterLabels {
    master: String,
}

/// The Redis store's series, once registered.
struct RedisSeries {
    breaker: Family<BreakerLabels, Gauge>,
    short_circuited: Counter<u64, AtomicU64>,
    refunds: Counter<u64, AtomicU64>,
    refund_failures: Counter<u64, AtomicU64>,
    master_breaker: Family<MasterBreakerLabels, Gauge>,
    master_short_circuited: Family<MasterLabels, Counter<u64, AtomicU64>>,
    master_round_trips: Family<MasterLabels, Counter<u64, AtomicU64>>,
}

/// A Redis store's telemetry: its breaker, and its series refreshed from
/// [`RedisStore::stats`] when `/metrics` renders.
pub struct RedisTelemetry {
    store: RedisStore,
    series: OnceLock<RedisSeries>,
    /// The masters shown at the last refresh, whose series go when they leave the map.
    shown: Mutex<Vec<String>>,
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
            shown: Mutex::new(Vec::new()),
        }
    }

    /// Sets the series from `stats` and each master's `masters`.
    fn show(&self, stats: &RedisStats, masters: &[MasterHealth]) {
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
        let mut shown = self.shown.lock().unwrap_or_else(|p| p.into_inner());
        for gone in shown
            .iter()
            .filter(|a| !masters.iter().any(|m| &m.address == *a))
        {
            for state in BreakerState::ALL {
                series.master_breaker.remove(&MasterBreakerLabels {
                    master: gone.clone(),
                    state: state.name(),
                });
            }
            let labels = MasterLabels {
                master: gone.clone(),
            };
            series.master_short_circuited.remove(&labels);
            series.master_round_trips.remove(&labels);
        }
        for m in masters {
            for state in BreakerState::ALL {
                series
                    .master_breaker
                    .get_or_create(&MasterBreakerLabels {
                        master: m.address.clone(),
                        state: state.name(),
                    })
                    .set(i64::from(state == m.breaker));
            }
            let labels = MasterLabels {
                master: m.address.clone(),
            };
            series
                .master_short_circuited
                .get_or_create(&labels)
                .inner()
                .store(m.short_circuited, Ordering::Relaxed);
            series
                .master_round_trips
                .get_or_create(&labels)
                .inner()
                .store(m.round_trips, Ordering::Relaxed);
        }
        *shown = masters.iter().map(|m| m.address.clone()).collect();
    }
}

impl StoreTelemetry for RedisTelemetry {
    fn breaker(&self) -> Option<BreakerState> {
        Some(self.store.breaker_state())
    }

    /// Registers the breaker state, calls short-circuited by the breaker, and multi-slot
    /// refunds; and on a Cluster each master's breaker, short-circuited calls and round trips.
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
            master_breaker: registered(
                registry,
                "store_master_breaker_state",
                "Each Redis Cluster master's circuit breaker state (1 for the current one)",
                Family::default(),
            ),
            master_short_circuited: registered(
                registry,
                "store_master_short_circuited",
                "Calls failed at once because a Redis Cluster master's breaker was open",
                Family::default(),
            ),
            master_round_trips: registered(
                registry,
                "store_master_round_trips",
                "Requests written to each Redis Cluster master (one per pipeline)",
                Family::default(),
            ),
        });
    }

    fn refresh(&self) {
        self.show(&self.store.stats(), &self.store.masters());
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;
    use sluice_redis::testing::{shared_cluster, test_options};

    use super::*;

    /// On a Cluster, `/metrics` has each master's breaker, labelled with its address.
    #[tokio::test]
    async fn a_cluster_store_reports_each_masters_breaker() {
        let cluster = shared_cluster();
        let store = RedisStore::connect(&cluster.url(), test_options())
            .await
            .unwrap();
        let telemetry = RedisTelemetry::new(store);
        let mut registry = Registry::with_prefix("sluice");
        telemetry.register(&mut registry);
        telemetry.refresh();
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for node in &cluster.nodes {
            let master = format!("127.0.0.1:{}", node.port);
            for line in [
                format!(
                    "sluice_store_master_breaker_state{{master=\"{master}\",state=\"closed\"}} 1"
                ),
                format!(
                    "sluice_store_master_breaker_state{{master=\"{master}\",state=\"open\"}} 0"
                ),
                format!("sluice_store_master_short_circuited_total{{master=\"{master}\"}} 0"),
            ] {
                assert!(text.contains(&line), "no `{line}` in:\n{text}");
            }
        }
        assert_eq!(telemetry.breaker(), Some(BreakerState::Closed));
    }
}
