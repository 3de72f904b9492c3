//! What the tests of one process share: one server, one Cluster, and key prefixes that keep
//! their counters apart on them.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::cluster::RedisCluster;
use super::server::RedisServer;
use crate::RedisOptions;

/// One standalone server for every test of this process that needs no server of its own.
pub fn shared_server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

/// One Cluster for every test of this process.
pub fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

/// A key prefix no other test of this run uses, so tests can share servers.
pub fn unique_prefix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "test{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Options for tests: a unique prefix and a generous timeout, since debug builds on a loaded
/// machine are slow and these tests are about behaviour, not speed.
pub fn test_options() -> RedisOptions {
    RedisOptions::default()
        .prefix(unique_prefix())
        .timeout(Duration::from_secs(5))
}

/// A store on `server` whose Redis time is 20 ms into an hour, for tests that count in hourly
/// windows without crossing one.
pub async fn store_at_hour_start(server: &super::RedisServer) -> crate::RedisStore {
    let store = crate::RedisStore::connect(&server.url(), test_options())
        .await
        .expect("a store on the test server");
    store.set_time_offset(super::offset_to_window_start(
        server.port,
        std::time::Duration::from_secs(3600),
    ));
    store
}
