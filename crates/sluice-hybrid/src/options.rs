//! How a hybrid store syncs, and how much it keeps: the options a `hybrid+` store URL's query
//! sets.

use std::time::Duration;

/// How a hybrid store syncs, and how much it keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HybridOptions {
    /// Time between two syncs. The error bound grows with it (see `docs/hybrid-store.md`).
    pub sync_interval: Duration,
    /// The most keys in one script call; a slot with more keys takes several calls, sent
    /// together.
    pub batch: usize,
    /// The most keys tracked locally. Each key's unsynchronised units live in its entry, so this
    /// also bounds what is kept while Redis is away.
    pub max_keys: usize,
}

impl Default for HybridOptions {
    fn default() -> Self {
        HybridOptions {
            sync_interval: Duration::from_millis(20),
            batch: 512,
            max_keys: 100_000,
        }
    }
}
