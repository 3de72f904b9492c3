//! [`RedisBackend`]: a Redis store under `sluice_core`'s shared backend suite, on the shared
//! server or the shared Cluster.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use sluice_core::Timestamp;
use sluice_core::testing::Backend;

use super::redis_time::{offset_to_second_start, redis_time_nanos};
use super::shared::{shared_cluster, shared_server, test_options};
use crate::RedisStore;

/// A Redis store under the shared backend suite, on a stopped clock that only the suite moves.
///
/// The store's scripts read a frozen time ([`RedisStore::freeze_time`]) in place of Redis
/// `TIME`, 20 ms after a whole second of Redis time when the backend is made, plus what the
/// suite has advanced (as the store's offset). On Redis's own running clock a call that a
/// loaded machine held for 200 ms saw a token of a 5-a-second bucket come back, and a burst of 5
/// admitted 6; frozen, the store answers as the memory store does on a `FakeClock`, to the
/// nanosecond.
pub struct RedisBackend {
    /// The store under test.
    pub store: RedisStore,
    /// What the suite has advanced, in nanoseconds.
    moved: AtomicI64,
}

impl RedisBackend {
    fn new(store: RedisStore, port: u16) -> Self {
        let at = redis_time_nanos(port) + offset_to_second_start(port);
        store.freeze_time(Timestamp::from_nanos(
            u64::try_from(at).expect("Redis time after the epoch"),
        ));
        store.set_time_offset(0);
        RedisBackend {
            store,
            moved: AtomicI64::new(0),
        }
    }
}

impl Backend for RedisBackend {
    type Store = RedisStore;

    fn store(&self) -> &RedisStore {
        &self.store
    }

    fn advance(&self, d: Duration) {
        let step = i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        let moved = self
            .moved
            .fetch_add(step, Ordering::SeqCst)
            .saturating_add(step);
        self.store.set_time_offset(moved);
    }
}

/// A fresh store on the shared standalone server, aligned to a second.
pub async fn standalone_backend() -> RedisBackend {
    let server = shared_server();
    let store = RedisStore::connect(&server.url(), test_options())
        .await
        .expect("connect");
    RedisBackend::new(store, server.port)
}

/// A fresh store on the shared Cluster, aligned to a second.
pub async fn cluster_backend() -> RedisBackend {
    let cluster = shared_cluster();
    let store = RedisStore::connect(&cluster.url(), test_options())
        .await
        .expect("connect");
    RedisBackend::new(store, cluster.nodes[0].port)
}
