//! HTTP glue for Sluice: how a decision is told to an HTTP client.
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

mod headers;

pub use headers::{HeaderStyle, Quota, rate_limit_headers, retry_after_secs};
