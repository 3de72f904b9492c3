//! What a store reports beyond its decisions, through one trait, so that the engine knows no
//! store by name: its circuit breaker, for `/readyz` and the dashboard, and its own series in
//! `/metrics`. A store that has neither (the memory store) reports [`NoTelemetry`]; the stores
//! that have them (Redis, hybrid) are reported by adapters where stores are opened
//! (`sluice-stores`).

use prometheus_client::registry::Registry;
use sluice_core::BreakerState;

/// A store's health and its own Prometheus series.
///
/// The engine calls [`StoreTelemetry::register`] once, when a limiter is built over the store,
/// so that the store's series follow the engine's own in `/metrics`, and
/// [`StoreTelemetry::refresh`] before every render, so that they are current when they are
/// exposed.
pub trait StoreTelemetry: Send + Sync {
    /// The store's circuit breaker, when it has one: `/readyz` answers not ready while it is
    /// open, and the dashboard shows it. `None` for a store that cannot be unreachable.
    fn breaker(&self) -> Option<BreakerState> {
        None
    }

    /// Registers the store's series in `registry`, the service's (whose prefix, `sluice_`, every
    /// name gets). Registering again, in the same registry or another, adds nothing: a store
    /// reports to one registry.
    fn register(&self, registry: &mut Registry) {
        let _ = registry;
    }

    /// Brings the registered series up to date from the store.
    fn refresh(&self) {}
}

/// The telemetry of a store with nothing to report beyond its decisions: no breaker, no series.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoTelemetry;

impl StoreTelemetry for NoTelemetry {}
