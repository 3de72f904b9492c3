//! Sluice's decision engine, which every front end ends in.
//!
//! The path of one request: a [`LimitRequest`] (domain, descriptors, costs) → the rules'
//! matches → checks `(counter key, policy, cost)` → one atomic `Store::check` → one
//! [`Decision`](sluice_core::Decision) per check → a [`Verdict`]. The verdict answers every
//! question a front end asks: is the request allowed, which limit is tightest, which limits
//! show in the rate-limit fields ([`Verdict::headers`]), what each descriptor's status is
//! ([`Verdict::status`]). gRPC, `/json`, `/v1/check`, the gateway and the tower layer only
//! format it, so nothing about limiting is decided twice.
//!
//! This crate depends on no HTTP server, client or framework: only on `http`'s header types. It
//! knows no store by name either: a store reaches it as an [`OpenStore`], the store behind the
//! `Store` trait and its [`StoreTelemetry`] (breaker, own metric series), which `sluice-stores`
//! opens from a store URL.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::sync::Arc;
//! use sluice_core::MemoryStore;
//! use sluice_limiter::{HeaderStyle, LimitRequest, Limiter, Metrics, RequestDescriptor};
//! use sluice_rules::{Reloader, RuleSet};
//!
//! let rules = RuleSet::parse("rules.yaml", "
//! domain: api
//! descriptors:
//!   - key: user
//!     rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}
//! ").unwrap();
//! let limiter = Limiter::new(
//!     Reloader::fixed(rules),
//!     Arc::new(MemoryStore::new()),
//!     Arc::new(Metrics::new()),
//! );
//! let request = LimitRequest {
//!     domain: "api".into(),
//!     descriptors: vec![RequestDescriptor::new([("user", "alice")])],
//!     cost: 1,
//! };
//! let mut verdicts = Vec::new();
//! for _ in 0..3 {
//!     verdicts.push(limiter.decide(&request).await.unwrap());
//! }
//! assert!(verdicts[1].allowed && !verdicts[2].allowed);
//! let headers = verdicts[2].headers(HeaderStyle::Ietf);
//! assert_eq!(headers[0].1, "\"per_user\";q=2;w=60");
//! assert_eq!(verdicts[2].status(0).limit.unwrap().name(), "per_user");
//! # }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod activity;
mod headers;
mod limiter;
pub mod limits;
mod metrics;
pub mod metrics_page;
mod open;
mod open_store;
mod overrides;
mod request;
mod store_telemetry;
mod verdict;

pub use headers::{HeaderStyle, retry_after_secs};
pub use limiter::{InvalidReservation, Limiter, ReservationTtls, Reserved, SettleRefused, Settled};
pub use metrics::{
    MAX_DECISION_SERIES, MAX_LABEL_VALUE_BYTES, Metrics, OVERFLOW_RULE, Outcome, Snapshot,
};
pub use open::{StartError, Watched, log_reloads};
pub use open_store::{OpenStore, StoreOpenError};
pub use overrides::{
    DescriptorEntry, OverrideError, OverridePut, OverrideSync, OverrideView, Overrides, POLL_EVERY,
};
pub use request::{InvalidRequest, LimitOverride, LimitRequest, RequestDescriptor};
pub use sluice_core::BreakerState;
pub use store_telemetry::{NoTelemetry, StoreTelemetry};
pub use verdict::{DescriptorStatus, LimitResult, Verdict, tightest};
