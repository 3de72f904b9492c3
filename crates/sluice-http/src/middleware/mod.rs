//! The tower middleware: [`SharedLimitLayer`] wraps any tower service or axum router.
//!
//! Every clone of the layer and of the services it makes shares one [`Enforcer`] and so one
//! limiter. Under axum, which clones the router for each connection, the limit therefore holds
//! across connections (tower's own `RateLimit` counts per clone).
//!
//! [`Enforcer`]: crate::Enforcer

mod future;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::{KeyExtractor, PeerAddr, SharedLimitLayer};
pub use service::{SharedLimit, SharedLimitBody};
