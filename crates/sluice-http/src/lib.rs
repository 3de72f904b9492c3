//! What an axum or hyper application embeds to rate-limit its own requests with Sluice: key
//! extraction from HTTP requests, the client IP behind trusted proxies, the rules' actions
//! (`reject`, `fake`, `delay`, `soft`), the tower [`SharedLimitLayer`], and the admin endpoints.
//!
//! Every decision is the engine's ([`sluice_limiter::Limiter`]); this crate only turns an HTTP
//! request into a [`sluice_limiter::LimitRequest`] and a [`sluice_limiter::Verdict`] into an
//! answer. `sluice proxy` (the `sluice-gateway` crate) is this layer around a forwarding
//! service. Both `sluice serve` and `sluice proxy` live the one [`lifecycle`] from start to
//! stop, serving connections through [`serve`].
//!
//! ```
//! use std::sync::Arc;
//! use sluice_core::{MemoryStore, Policy, Rate, TokenBucket};
//! use sluice_http::SharedLimitLayer;
//!
//! let policy = Policy::from(TokenBucket::new(20, Rate::per_second(10)).unwrap());
//! let layer = SharedLimitLayer::with_policy(policy, Arc::new(MemoryStore::new()), |_, ip| {
//!     Some(ip.to_string())
//! });
//! let app: axum::Router = axum::Router::new()
//!     .route("/", axum::routing::get(|| async { "hello" }))
//!     .layer(layer);
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

#[cfg(feature = "axum")]
pub mod admin;
#[cfg(feature = "axum")]
mod admin_overrides;
pub mod client_ip;
pub mod connection_deadlines;
mod dashboard;
mod enforce;
pub mod extract;
pub mod h1_server;
pub mod header_blocks;
mod http_date;
pub mod lifecycle;
pub mod middleware;
#[cfg(feature = "axum")]
pub mod problem;
pub mod request_body;
pub mod send_progress;
pub mod serve;
pub mod settle;

pub use enforce::{
    DEFAULT_MAX_DELAYED, Enforcement, Enforcer, QUOTA_EXCEEDED, pass_headers, reject,
};
pub use extract::Extracted;
pub use middleware::{PeerAddr, SharedLimit, SharedLimitLayer};
pub use request_body::RequestBody;
