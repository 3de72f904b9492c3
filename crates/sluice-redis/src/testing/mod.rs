//! Real Redis for tests and benchmarks: `redis-server` processes on free loopback ports (one
//! server, a TLS server, a replica, a Sentinel, or a 3-master Cluster, with a replica per master
//! if asked), stores on them under the shared backend suite, and the script internals that the
//! check script's differential test compares with the core. Enabled by the `testing` feature;
//! `redis-server` and `redis-cli` must be on the `PATH`.
//!
//! Each server lives in its own temporary directory, without persistence, and is killed when its
//! handle drops, or by a watchdog when the test process ends. Ports, child processes and waits
//! with a deadline are `sluice-test-support`'s, the layer below every crate's tests. Tests that
//! need no server of their own share one ([`shared_server`], [`shared_cluster`]) and keep their
//! counters apart with [`unique_prefix`].
//!
//! ```no_run
//! use sluice_redis::RedisStore;
//! use sluice_redis::testing::{shared_server, test_options};
//!
//! # async fn run() {
//! let store = RedisStore::connect(&shared_server().url(), test_options()).await.unwrap();
//! # }
//! ```

mod backend;
mod cluster;
mod frozen_clock;
mod policies;
mod redis_time;
mod script;
mod server;
mod shared;

pub use backend::{RedisBackend, cluster_backend, standalone_backend};
pub use cluster::RedisCluster;
pub(crate) use frozen_clock::frozen_script;
pub use policies::{fifty_per_hour, name};
pub use redis_time::{offset_to_second_start, offset_to_window_start, redis_time_nanos};
pub use script::{check_script, decode_replies, push_check};
pub use server::RedisServer;
pub use shared::{shared_cluster, shared_server, store_at_hour_start, test_options, unique_prefix};
