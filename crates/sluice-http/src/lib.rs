//! HTTP front ends for Sluice.
//!
//! - [`Limiter`] is the one decision path every front end ends in: descriptors, rules, checks,
//!   store, verdict, with fallback on store errors and metrics. The service (`sluice serve`),
//!   the gateway and the tower layer all call it, so nothing about limiting is decided twice.
//! - [`rate_limit_headers`] tells a decision to an HTTP client.
//!
//! ```
//! use std::time::Duration;
//! use sluice_core::{Decision, Policy, Rate, TokenBucket};
//! use sluice_http::{HeaderStyle, Quota, rate_limit_headers};
//!
//! let policy = Policy::from(TokenBucket::new(10, Rate::per_second(10)).unwrap());
//! let decision = Decision {
//!     allowed: true, limit: 10, remaining: 7, reset_after: Duration::from_millis(300),
//!     retry_after: Duration::ZERO, delay: Duration::ZERO,
//! };
//! let headers = rate_limit_headers(&[Quota::new("burst", &policy, &decision)], HeaderStyle::Ietf);
//! assert_eq!(headers[0].1, "\"burst\";q=10;w=1");
//! assert_eq!(headers[1].1, "\"burst\";r=7;t=1");
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod client_ip;
mod enforce;
pub mod extract;
mod headers;
pub mod limiter;
pub mod limits;
pub mod metrics;
pub mod middleware;
pub mod proxy;

pub use enforce::{DEFAULT_MAX_DELAYED, Enforcement, Enforcer, QUOTA_EXCEEDED, reject};
pub use extract::Extracted;
pub use headers::{HeaderStyle, Quota, rate_limit_headers, retry_after_secs};
pub use limiter::{LimitRequest, Limiter, RequestDescriptor, Verdict};
pub use metrics::{Metrics, Outcome};
pub use middleware::{PeerAddr, RateLimit, RateLimitLayer};
pub use proxy::{Proxy, ProxyError, ProxyOptions};
