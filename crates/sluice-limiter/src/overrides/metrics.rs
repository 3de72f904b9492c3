//! The `sluice_overrides*` series: how many overrides apply per domain, how many match no rule,
//! and how fresh this instance's copy of the shared ones is.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::OverrideSync;
use super::compiled::Compiled;
use super::record::Record;

/// A domain's series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DomainLabels {
    domain: String,
}

/// The series, registered once in the service's registry.
#[derive(Debug, Default)]
pub(super) struct OverrideMetrics {
    /// Overrides in force, per domain.
    applied: Family<DomainLabels, Gauge>,
    /// Overrides kept that match no rule in force.
    unmatched: Gauge,
    /// Seconds since the shared overrides were last read (0 for overrides local to the
    /// instance).
    sync_age: Gauge<f64, AtomicU64>,
    /// 1 while the store does not answer and the instance enforces what it last read.
    stale: Gauge,
}

impl OverrideMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "overrides",
            "Runtime overrides in force, per domain",
            self.applied.clone(),
        );
        registry.register(
            "overrides_unmatched",
            "Runtime overrides kept that match no rule in force (see GET /v1/overrides/{domain})",
            self.unmatched.clone(),
        );
        registry.register(
            "overrides_sync_age_seconds",
            "Seconds since this instance last read the shared runtime overrides",
            self.sync_age.clone(),
        );
        registry.register(
            "overrides_stale",
            "1 while the store does not answer and this instance enforces the overrides it last read",
            self.stale.clone(),
        );
    }

    /// Counts the overrides of `compiled`, out of `records`.
    pub(super) fn set(&self, records: &BTreeMap<String, Record>, compiled: &Compiled) {
        self.applied.clear();
        for (domain, table) in &compiled.domains {
            self.applied
                .get_or_create(&DomainLabels {
                    domain: domain.clone(),
                })
                .set(i64::try_from(table.len()).unwrap_or(i64::MAX));
        }
        // Domains whose every override expired or stopped matching still show, at 0.
        for record in records.values() {
            let _ = self.applied.get_or_create(&DomainLabels {
                domain: record.domain.clone(),
            });
        }
        self.unmatched
            .set(i64::try_from(compiled.unmatched.len()).unwrap_or(i64::MAX));
    }

    /// Reports how fresh the shared overrides are.
    pub(super) fn set_sync(&self, sync: &OverrideSync) {
        let age = match (sync.shared, sync.last_sync) {
            (false, _) => 0.0,
            (true, Some(d)) => d.as_secs_f64(),
            (true, None) => f64::INFINITY,
        };
        self.sync_age.set(age);
        self.stale.set(i64::from(sync.error.is_some()));
    }
}
