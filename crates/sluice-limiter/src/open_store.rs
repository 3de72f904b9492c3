//! An open store as the engine takes it: the store every decision goes to, and its telemetry.
//! Which store it is, and how it was opened, the engine never learns: `sluice-stores` opens a
//! store from its URL and hands over an [`OpenStore`], and an application that builds its own
//! store wraps it with [`OpenStore::plain`].

use std::sync::Arc;

use sluice_core::DynStore;
use sluice_rules::{LoadError, RuleSet};

use crate::store_telemetry::{NoTelemetry, StoreTelemetry};

/// An open store, and what the service can ask of it beyond decisions.
#[derive(Clone)]
pub struct OpenStore {
    /// The store every decision goes to.
    pub store: Arc<dyn DynStore>,
    /// Its breaker and its own series, for `/readyz`, the dashboard and `/metrics`.
    pub telemetry: Arc<dyn StoreTelemetry>,
}

impl std::fmt::Debug for OpenStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenStore")
            .field("breaker", &self.telemetry.breaker())
            .finish_non_exhaustive()
    }
}

impl OpenStore {
    /// A store with nothing to report beyond its decisions, such as the memory store.
    pub fn plain(store: Arc<dyn DynStore>) -> Self {
        OpenStore {
            store,
            telemetry: Arc::new(NoTelemetry),
        }
    }

    /// What every rule set must pass before it is put in force, at startup and on each reload
    /// (see [`sluice_rules::Reloader::with_check`]): that this store can hold every rule. The
    /// redis store, for one, cannot hold a window longer than about 104 days.
    pub fn supports_check(
        &self,
    ) -> impl Fn(&RuleSet) -> Result<(), LoadError> + Send + Sync + 'static {
        let store = Arc::clone(&self.store);
        move |rules| rules.check_supported(|policy| store.supports(policy))
    }
}

/// A store that could not be opened, as the crate that opened it reports it (its URL, its
/// parameters, its server), kept whole: it reads and chains exactly as the store's own error.
#[derive(Debug)]
pub struct StoreOpenError(Box<dyn std::error::Error + Send + Sync>);

impl StoreOpenError {
    /// Wraps the error of the crate that opened the store.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreOpenError(Box::new(error))
    }
}

impl std::fmt::Display for StoreOpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for StoreOpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}
