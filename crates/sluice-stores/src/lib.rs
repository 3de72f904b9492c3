//! Opens a Sluice store from its URL: the one crate that knows every store.
//!
//! The engine (`sluice-limiter`) decides through the `Store` trait and knows no store by name;
//! the front ends (`sluice serve`, `sluice proxy`, `sluice validate`) name a store by its URL
//! (`--store`). This crate joins the two: [`open`] turns `memory`, a Redis URL or a
//! `hybrid+redis://` URL into a [`sluice_limiter::OpenStore`], the store and its telemetry (the
//! breaker for `/readyz`, the store's own series in `/metrics`), and [`supports_check_for`] says
//! which rules a store would refuse without opening it. A new store is one more arm here and an
//! adapter of its telemetry; the engine does not change.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::sync::Arc;
//! use sluice_limiter::{Limiter, Metrics};
//! use sluice_rules::{Reloader, RuleSet};
//! use sluice_stores::{StoreSettings, open};
//!
//! let opened = open("memory://?max_keys=1000", &StoreSettings::default()).await.unwrap();
//! assert!(opened.telemetry.breaker().is_none(), "a memory store has no breaker");
//! let rules = RuleSet::parse("rules.yaml", "domain: api\ndescriptors: []\n").unwrap();
//! let metrics = Arc::new(Metrics::new());
//! let limiter = Limiter::with_open_store(Reloader::fixed(rules), opened, metrics);
//! assert!(limiter.render_metrics().contains("sluice_tracked_keys"));
//! assert!(open("postgres://db", &StoreSettings::default()).await.is_err());
//! # }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod hybrid_telemetry;
mod redis_telemetry;
mod store_url;

use prometheus_client::registry::{Metric, Registry};

pub use hybrid_telemetry::HybridTelemetry;
pub use redis_telemetry::RedisTelemetry;
pub use store_url::{StoreSettings, StoreUrlError, open, supports_check_for};

/// `metric`, registered in `registry` under `name` with `help`.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}
