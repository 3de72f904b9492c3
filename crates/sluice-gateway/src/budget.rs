//! Token budgets: a route with `usage` reserves an estimate before forwarding, and settles it
//! with the usage the answer reports. See `docs/usage-limits.md`, "Gateway".
//!
//! The parts: the estimate read from the request ([`request_estimate`]), the answer's body that
//! reads its usage as it passes ([`usage_body`], with [`sse_scanner`] for event streams and
//! [`json_units`] for JSON); the reservation is settled once whatever happens by
//! `sluice_http::settle`, which the tower layer's concurrency limits share.

mod json_units;
mod request_estimate;
mod sse_scanner;
mod usage_body;

pub(crate) use request_estimate::estimate;
pub(crate) use usage_body::usage_body;
pub use usage_body::{AnswerMeter, UsageBody};
