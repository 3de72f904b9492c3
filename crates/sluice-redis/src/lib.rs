//! The Redis store for Sluice: exact limits shared by any number of instances, on Redis (or
//! Valkey) standalone, Sentinel or Cluster.
//!
//! [`RedisStore`] implements the core [`Store`](sluice_core::Store) contract for all six
//! algorithms. Each check runs as one atomic Lua script per Cluster slot, on Redis `TIME`, so
//! instances with skewed clocks agree. Checks of one request that span slots are reserved slot
//! by slot and given back if any slot refuses. Reservations (`Store::reserve`, `settle`,
//! `refund`) are recorded in Redis beside the counters, so any instance settles them. Every call has a timeout, and a circuit breaker
//! answers at once while Redis is down, so that each rule's `on_store_error` can decide fast.
//! `docs/redis-store.md` describes the key layout, the scripts and the failure handling.
//!
//! [`supports`] says, without a connection, whether a Redis store can hold a policy: the scripts
//! compute in Lua doubles, so a few extreme policies are refused when rules load. The `testing`
//! feature adds `sluice_redis::testing`: real `redis-server` processes (one server, a Cluster, a
//! Sentinel) on free loopback ports, for this crate's tests and those of the crates above it.
//!
//! ```no_run
//! use sluice_core::{Check, Gcra, Policy, Rate, Store};
//! use sluice_redis::{RedisOptions, RedisStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379", RedisOptions::default()).await?;
//! let policy = Policy::from(Gcra::new(Rate::per_second(10), 20)?);
//! let decisions = store.check(&[Check::new("api|user=alice", &policy, 1)]).await?;
//! assert!(decisions[0].allowed);
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod breaker;
mod calls;
mod connection;
mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod heartbeat;
mod keys;
mod masters;
mod options;
mod pipe;
mod scripts;
mod store;
#[cfg(feature = "testing")]
pub mod testing;
mod url;

pub use error::ConnectError;
pub use keys::slot;
pub use masters::MasterHealth;
pub use options::RedisOptions;
pub use redis::Value;
pub use scripts::Script;
pub use scripts::algorithm::code as algorithm_code;
pub use scripts::args::app_now;
pub use store::{RedisStats, RedisStore, supports};
pub use url::{RedisUrl, Topology};
