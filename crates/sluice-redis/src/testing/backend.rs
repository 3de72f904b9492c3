//! [`RedisBackend`]: a Redis store under `sluice_core`'s shared backend suite, on the shared
//! server or the shared Cluster.

use std::time::Duration;

use sluice_core::testing::Backend;

use super::redis_time::offset_to_second_start;
use super::shared::{shared_cluster, shared_server, test_options};
use crate::RedisStore;

/// A Redis store under the shared backend suite.
pub struct RedisBackend {
    /// The store under test; the suite moves its time with [`RedisStore::advance_time`].
    pub store: RedisStore,
}

impl Backend for RedisBackend {
    type Store = RedisStore;

    fn store(&self) -> &RedisStore {
        &self.store
    }

    fn advance(&self, d: Duration) {
        self.store.advance_time(d);
    }
}

/// A fresh store on the shared standalone server, aligned to a second.
pub async fn standalone_backend() -> RedisBackend {
    let server = shared_server();
    let store = RedisStore::connect(&server.url(), test_options())
        .await
        .expect("connect");
    store.set_time_offset(offset_to_second_start(server.port));
    RedisBackend { store }
}

/// A fresh store on the shared Cluster, aligned to a second.
pub async fn cluster_backend() -> RedisBackend {
    let cluster = shared_cluster();
    let store = RedisStore::connect(&cluster.url(), test_options())
        .await
        .expect("connect");
    store.set_time_offset(offset_to_second_start(cluster.nodes[0].port));
    RedisBackend { store }
}
