//! Token budgets: a route with `usage` reserves an estimate before forwarding, and settles it
//! with the usage the answer reports. See `docs/usage-limits.md`, "Gateway".
//!
//! The parts: the estimate read from the request ([`request_estimate`]), the answer's body that
//! reads its usage as it passes ([`usage_body`], with [`sse_scanner`] for event streams and
//! [`json_units`] for JSON), and the reservation that is settled once whatever happens
//! ([`pending_settle`]).

mod json_units;
mod pending_settle;
mod request_estimate;
mod sse_scanner;
mod usage_body;

pub(crate) use pending_settle::PendingSettle;
pub(crate) use request_estimate::estimate;
pub use usage_body::UsageBody;
