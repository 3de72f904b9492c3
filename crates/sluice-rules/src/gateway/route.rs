//! One route: what requests it matches, and the descriptors it builds for them.

use std::sync::Arc;

use super::{HostMatch, PathPattern, RouteUsage, ValueSource};
use crate::error::Location;

/// Which rate-limit fields a route's answers carry. Mirrors the HTTP crate's header style,
/// which this crate cannot name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RouteHeaders {
    /// The IETF `RateLimit-Policy` and `RateLimit` fields.
    #[default]
    Ietf,
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset`.
    Legacy,
    /// Both sets.
    Both,
    /// Neither; a refusal still carries `Retry-After`.
    None,
}

impl RouteHeaders {
    /// The names the configuration uses.
    pub const NAMES: [&'static str; 4] = ["ietf", "legacy", "both", "none"];
}

/// One route.
#[derive(Debug, Clone)]
pub struct Route {
    /// The route's name for logs: its `name`, else its path pattern, else its position.
    pub name: Arc<str>,
    /// The path it matches; `None` matches every path.
    pub path: Option<PathPattern>,
    /// The methods it matches, upper case; empty matches every method.
    pub methods: Vec<String>,
    /// The host it matches; `None` matches every host.
    pub host: Option<HostMatch>,
    /// The rules domain its descriptors are checked against: the file's domain unless set.
    pub domain: String,
    /// The descriptors to build. Empty means the route passes unlimited.
    pub descriptors: Vec<Vec<EntrySpec>>,
    /// The cost of one request.
    pub cost: u64,
    /// Which rate-limit fields its answers carry.
    pub headers: RouteHeaders,
    /// Its token budget: reserve an estimate, settle with the usage the answer reports.
    /// `None` (most routes) checks `cost` per request as before.
    pub usage: Option<Arc<RouteUsage>>,
    /// Where the route starts.
    pub location: Location,
}

impl Route {
    /// Whether the route matches a request; on a match, the path parameters it captured.
    pub fn matches<'p>(
        &self,
        method: &str,
        host: Option<&str>,
        path: &'p str,
    ) -> Option<Vec<(&str, &'p str)>> {
        if !self.methods.is_empty() && !self.methods.iter().any(|m| m == method) {
            return None;
        }
        if let Some(h) = &self.host {
            if !host.is_some_and(|host| h.matches(host)) {
                return None;
            }
        }
        match &self.path {
            Some(p) => p.matches(path),
            None => Some(Vec::new()),
        }
    }
}

/// One descriptor entry of a route: a key, and where its value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntrySpec {
    /// The entry key, as the domain's descriptors name it.
    pub key: String,
    /// Where the value comes from.
    pub source: ValueSource,
    /// The value when the source has none. Without one, a descriptor with a missing value is
    /// left out of the request, as Envoy leaves out a descriptor whose header is absent.
    pub default: Option<String>,
}
