//! Starting a limiter as the service and the gateway run it: rules loaded with the store's
//! check, reloaded from disk as they change, and every reload logged.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_rules::{LoadError, LoadOptions, ReloadEvent, Reloader, Watcher};

use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::open_store::{OpenStore, StoreOpenError};

/// Why a limiter could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The rules are invalid, or hold a rule the store cannot; the error names every
    /// `file:line:col`.
    #[error("invalid rules:\n{0}")]
    Rules(LoadError),
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreOpenError),
    /// The rule files cannot be watched.
    #[error("cannot watch the rule files for changes: {0}")]
    Watch(String),
}

// Not `#[from]`: that would make the rule errors the source as well, and a report of the error
// chain (`sluice: {e:#}`) would print every one of them twice.
impl From<LoadError> for StartError {
    fn from(e: LoadError) -> Self {
        StartError::Rules(e)
    }
}

/// A limiter whose rules follow their files, and the watcher that keeps them current: the
/// limiter stops following its files when the watcher is dropped.
#[derive(Debug)]
pub struct Watched {
    /// The limiter.
    pub limiter: Arc<Limiter>,
    /// Reloads the rules when their files change.
    pub watcher: Watcher,
}

impl Limiter {
    /// Loads the rules at `config` as `load` says (refusing any that `opened` cannot hold, then
    /// and on every reload), watches them for changes with `debounce`, logs every reload, and
    /// returns the limiter over them.
    pub fn watching(
        config: Vec<PathBuf>,
        load: LoadOptions,
        opened: OpenStore,
        debounce: Duration,
    ) -> Result<Watched, StartError> {
        let reloader = Reloader::with_options(config, load, opened.supports_check())?;
        let watcher = reloader
            .watch(debounce)
            .map_err(|e| StartError::Watch(e.to_string()))?;
        log_reloads(&reloader);
        let limiter = Arc::new(Limiter::with_open_store(
            reloader,
            opened,
            Arc::new(Metrics::new()),
        ));
        Ok(Watched { limiter, watcher })
    }
}

/// Logs every reload's outcome, on a thread of its own that ends with the reloader.
pub fn log_reloads(reloader: &Reloader) {
    let events = reloader.subscribe();
    let spawned = std::thread::Builder::new()
        .name("sluice-reload-log".into())
        .spawn(move || {
            for event in events {
                match event {
                    ReloadEvent::Reloaded { fingerprint } => {
                        tracing::info!(
                            fingerprint = format!("{fingerprint:016x}"),
                            "rules reloaded"
                        );
                    }
                    ReloadEvent::Unchanged => {
                        tracing::debug!("rule files touched; rules unchanged");
                    }
                    ReloadEvent::Failed(e) => {
                        tracing::error!("rules not reloaded; the old rules stay in force:\n{e}");
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the reload logger; reloads still happen");
    }
}
