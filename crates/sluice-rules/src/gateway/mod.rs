//! The gateway's routes: which requests `sluice proxy` limits, and how it builds their
//! descriptors.
//!
//! A rule file may carry a top-level `routes:` list and `trusted_proxies:` beside its domain,
//! so one file describes a whole gateway. Routes are tried in order and the first that matches
//! a request's path, method and host decides its descriptors; a request no route matches is not
//! limited. See `docs/rules.md`.
//!
//! The model is split by what each part matches: [`Route`] (with [`RouteHeaders`] and its
//! descriptor entries, [`EntrySpec`]), the [`PathPattern`] of a route, the [`HostMatch`] of a
//! route, where an entry's value comes from ([`ValueSource`]), the networks of trusted
//! proxies ([`Cidr`]), and a route's token budget ([`RouteUsage`]).

use crate::error::Location;

mod cidr;
mod host;
mod path_pattern;
mod route;
mod usage;
mod value_source;

pub use cidr::Cidr;
pub use host::{HostMatch, strip_port};
pub use path_pattern::PathPattern;
pub use route::{EntrySpec, Route, RouteHeaders};
pub use usage::{DEFAULT_MAX_BODY, JsonPath, JsonStep, ReserveFrom, RouteUsage};
pub use value_source::ValueSource;

/// The gateway section of a rule file.
#[derive(Debug, Clone, Default)]
pub struct Gateway {
    /// Routes, in the order they are tried.
    pub routes: Vec<Route>,
    /// Peers whose `X-Forwarded-For` and `Forwarded` headers are believed. A client outside
    /// them cannot choose its own IP, and so cannot escape a per-IP limit.
    pub trusted_proxies: Vec<Cidr>,
    /// Where the section starts, so a second one in another file can point back to it.
    pub location: Option<Location>,
}
