//! [`RedisBackend`]: a Redis store under `sluice_core`'s shared backend suite, on the shared
//! server or the shared Cluster.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use sluice_core::testing::Backend;

use super::redis_time::offset_to_second_start;
use super::shared::{shared_cluster, shared_server, test_options};
use crate::RedisStore;

/// A Redis store under the shared backend suite, on a clock that a stalled test cannot move far.
///
/// The store's time is Redis `TIME` plus its offset, and Redis time keeps running: a test that
/// stalls for 200 ms on a loaded machine would see a token of a 5-a-second bucket come back, or
/// a one-second window end. So every time the suite takes the store, the real time since it
/// last did counts for at most [`RedisBackend::MAX_GAP`]; the rest is taken off the store's
/// offset. Time still runs forward between two calls (a call's answer depends on it: a check
/// made after advancing by a refusal's `retry_after` must land after the refusal's own time, and
/// each call reaches Redis some microseconds after the backend set the offset), and only the
/// suite's advances move it far.
pub struct RedisBackend {
    /// The store under test.
    pub store: RedisStore,
    /// The store's offset when the backend was made.
    base: i64,
    /// What the suite has advanced, less the real time taken off, in nanoseconds.
    moved: AtomicI64,
    /// When the suite last took the store.
    last: Mutex<SystemTime>,
}

impl RedisBackend {
    /// The most real time that counts between two takes of the store.
    pub const MAX_GAP: Duration = Duration::from_millis(10);

    fn new(store: RedisStore, offset: i64) -> Self {
        store.set_time_offset(offset);
        RedisBackend {
            store,
            base: offset,
            moved: AtomicI64::new(0),
            last: Mutex::new(SystemTime::now()),
        }
    }

    /// Takes off the real time past [`RedisBackend::MAX_GAP`] since the last take, and sets
    /// the store's offset.
    fn hold_time(&self) {
        let now = SystemTime::now();
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let gap = now.duration_since(*last).unwrap_or_default();
        *last = now;
        if let Some(excess) = gap.checked_sub(Self::MAX_GAP) {
            let excess = i64::try_from(excess.as_nanos()).unwrap_or(i64::MAX);
            self.moved.fetch_sub(excess, Ordering::SeqCst);
        }
        let moved = self.moved.load(Ordering::SeqCst);
        self.store.set_time_offset(self.base.saturating_add(moved));
    }
}

impl Backend for RedisBackend {
    type Store = RedisStore;

    fn store(&self) -> &RedisStore {
        self.hold_time();
        &self.store
    }

    fn advance(&self, d: Duration) {
        let step = i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        self.moved.fetch_add(step, Ordering::SeqCst);
        self.hold_time();
    }
}

/// A fresh store on the shared standalone server, aligned to a second.
pub async fn standalone_backend() -> RedisBackend {
    let server = shared_server();
    let store = RedisStore::connect(&server.url(), test_options())
        .await
        .expect("connect");
    RedisBackend::new(store, offset_to_second_start(server.port))
}

/// A fresh store on the shared Cluster, aligned to a second.
pub async fn cluster_backend() -> RedisBackend {
    let cluster = shared_cluster();
    let store = RedisStore::connect(&cluster.url(), test_options())
        .await
        .expect("connect");
    RedisBackend::new(store, offset_to_second_start(cluster.nodes[0].port))
}
