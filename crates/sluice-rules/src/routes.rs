//! The gateway's routes: which requests `sluice proxy` limits, and how it builds their
//! descriptors.
//!
//! A rule file may carry a top-level `routes:` list and `trusted_proxies:` beside its domain,
//! so one file describes a whole gateway. Routes are tried in order and the first that matches
//! a request's path, method and host decides its descriptors; a request no route matches is not
//! limited. See `docs/rules.md`.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

use crate::error::Location;

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

/// Where an entry's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueSource {
    /// The client IP: the socket peer, or the forwarded client when the peer is a trusted proxy.
    ClientIp,
    /// A request header (the name in lower case).
    Header(String),
    /// A query parameter, percent-decoded.
    Query(String),
    /// A cookie.
    Cookie(String),
    /// The token of an `Authorization: Bearer` header.
    Bearer,
    /// The API key: the bearer token, else the `X-API-Key` header.
    ApiKey,
    /// The request path, without the query.
    Path,
    /// A parameter of the route's path pattern.
    PathParam(String),
    /// The method.
    Method,
    /// The host, without the port.
    Host,
    /// A fixed value, for global limits.
    Constant(String),
}

impl ValueSource {
    /// The forms `from:` accepts, for error messages.
    pub const FORMS: [&'static str; 10] = [
        "client_ip",
        "method",
        "path",
        "host",
        "bearer",
        "api_key",
        "header:NAME",
        "query:NAME",
        "cookie:NAME",
        "param:NAME",
    ];

    /// Parses a `from:` value; `None` for an unknown form.
    pub fn parse(text: &str) -> Option<ValueSource> {
        let named = |prefix: &str| {
            text.strip_prefix(prefix)
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
        };
        Some(match text {
            "client_ip" => ValueSource::ClientIp,
            "method" => ValueSource::Method,
            "path" => ValueSource::Path,
            "host" => ValueSource::Host,
            "bearer" => ValueSource::Bearer,
            "api_key" => ValueSource::ApiKey,
            _ => {
                if let Some(n) = named("header:") {
                    ValueSource::Header(n.to_ascii_lowercase())
                } else if let Some(n) = named("query:") {
                    ValueSource::Query(n)
                } else if let Some(n) = named("cookie:") {
                    ValueSource::Cookie(n)
                } else if let Some(n) = named("param:") {
                    ValueSource::PathParam(n)
                } else {
                    return None;
                }
            }
        })
    }
}

/// One segment of a path pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// This exact segment.
    Literal(String),
    /// Any non-empty segment, captured under a name.
    Param(String),
    /// Whatever is left of the path starts with this (`/api*`).
    Prefix(String),
}

/// A path pattern: `/health` (exact), `/api/*` (the segment and anything under it), `/api*`
/// (a plain prefix), `/users/{id}` (one segment captured) or `/files/{*rest}` (the rest
/// captured).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    segments: Vec<Segment>,
    /// What may follow the segments: nothing, anything, or anything captured under a name.
    tail: Tail,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tail {
    None,
    Any,
    Capture(String),
}

impl PathPattern {
    /// Parses a pattern; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<PathPattern, &'static str> {
        let Some(rest) = text.strip_prefix('/') else {
            return Err("a path pattern starts with `/`");
        };
        let mut segments = Vec::new();
        let mut tail = Tail::None;
        let parts: Vec<&str> = rest.split('/').collect();
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            if let Some(inner) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                if let Some(name) = inner.strip_prefix('*') {
                    if !last {
                        return Err("`{*name}` may only end a path pattern");
                    }
                    if name.is_empty() || name.contains(['{', '}', '*']) {
                        return Err("`{*}` needs a name, such as `{*rest}`");
                    }
                    tail = Tail::Capture(name.to_owned());
                } else if inner.is_empty() || inner.contains(['{', '}', '*']) {
                    return Err("a parameter is a name in braces, such as `{id}`");
                } else {
                    segments.push(Segment::Param(inner.to_owned()));
                }
            } else if part.contains(['{', '}']) {
                return Err("a parameter fills a whole segment, such as `/users/{id}`");
            } else if let Some(prefix) = part.strip_suffix('*') {
                if !last || prefix.contains('*') {
                    return Err("`*` may only end a path pattern");
                }
                if prefix.is_empty() {
                    tail = Tail::Any;
                } else {
                    segments.push(Segment::Prefix(prefix.to_owned()));
                }
            } else if part.contains('*') {
                return Err("`*` may only end a path pattern");
            } else {
                segments.push(Segment::Literal((*part).to_owned()));
            }
        }
        Ok(PathPattern {
            text: text.to_owned(),
            segments,
            tail,
        })
    }

    /// The names of the parameters the pattern captures.
    pub fn params(&self) -> impl Iterator<Item = &str> {
        self.segments
            .iter()
            .filter_map(|s| match s {
                Segment::Param(n) => Some(n.as_str()),
                _ => None,
            })
            .chain(match &self.tail {
                Tail::Capture(n) => Some(n.as_str()),
                _ => None,
            })
    }

    /// Matches `path` (without its query), returning the captured parameters. A trailing slash
    /// is tolerated: `/health` matches `/health/`.
    pub fn matches<'p>(&self, path: &'p str) -> Option<Vec<(&str, &'p str)>> {
        let mut rest = path.strip_prefix('/')?;
        let mut captured = Vec::new();
        for (i, segment) in self.segments.iter().enumerate() {
            if let Segment::Prefix(p) = segment {
                return rest.starts_with(p.as_str()).then_some(captured);
            }
            let (part, after) = match rest.split_once('/') {
                Some((p, a)) => (p, Some(a)),
                None => (rest, None),
            };
            match segment {
                Segment::Literal(l) if l == part => {}
                Segment::Param(name) if !part.is_empty() => captured.push((name.as_str(), part)),
                _ => return None,
            }
            match after {
                Some(a) => rest = a,
                None if i + 1 < self.segments.len() => return None,
                None => {
                    // The path ends with the last segment: `/api/*` matches `/api` too.
                    if let Tail::Capture(name) = &self.tail {
                        captured.push((name.as_str(), ""));
                    }
                    return Some(captured);
                }
            }
        }
        match &self.tail {
            Tail::None => rest.is_empty().then_some(captured),
            Tail::Any => Some(captured),
            Tail::Capture(name) => {
                captured.push((name.as_str(), rest));
                Some(captured)
            }
        }
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A host to match: exact, or `*.example.com` for any subdomain. Case-insensitive, port
/// ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    /// This host only.
    Exact(String),
    /// Any host ending in this suffix (which starts with a dot).
    Suffix(String),
}

impl HostMatch {
    /// Parses `api.example.com` or `*.example.com`.
    pub fn parse(text: &str) -> HostMatch {
        let lower = text.to_ascii_lowercase();
        match lower.strip_prefix('*') {
            Some(suffix) => HostMatch::Suffix(suffix.to_owned()),
            None => HostMatch::Exact(lower),
        }
    }

    /// Whether `host` (which may carry a port) matches.
    pub fn matches(&self, host: &str) -> bool {
        let host = strip_port(host);
        match self {
            HostMatch::Exact(h) => host.eq_ignore_ascii_case(h),
            HostMatch::Suffix(s) => {
                host.len() > s.len()
                    && host.is_char_boundary(host.len() - s.len())
                    && host[host.len() - s.len()..].eq_ignore_ascii_case(s)
            }
        }
    }
}

/// `example.com:8080` → `example.com`; `[::1]:80` → `[::1]`.
pub fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split_once(']')
            .map_or(host, |(h, _)| &host[..=h.len()]);
    }
    match host.rsplit_once(':') {
        Some((h, port)) if !h.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

/// An IP network: an address and a prefix length, such as `10.0.0.0/8` or `::1/128`. A bare
/// address is a network of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is inside the network. An IPv4 address written as IPv6 (`::ffff:a.b.c.d`)
    /// is compared as IPv4.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(
                u128::from(net.to_bits()),
                u128::from(ip.to_bits()),
                32,
                self.prefix,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(net.to_bits(), ip.to_bits(), 128, self.prefix)
            }
            _ => false,
        }
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

fn prefix_eq(a: u128, b: u128, bits: u32, prefix: u8) -> bool {
    let prefix = u32::from(prefix).min(bits);
    if prefix == 0 {
        return true;
    }
    let shift = bits - prefix;
    (a >> shift) == (b >> shift)
}

impl FromStr for Cidr {
    type Err = &'static str;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const HINT: &str = "an IP address or network, such as 10.0.0.0/8, 192.168.1.7 or ::1/128";
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr = canonical(addr.trim().parse::<IpAddr>().map_err(|_| HINT)?);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or(HINT)?,
            None => max,
        };
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m<'p>(pattern: &str, path: &'p str) -> Option<Vec<(String, &'p str)>> {
        let p = PathPattern::parse(pattern).unwrap();
        p.matches(path)
            .map(|v| v.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
    }

    #[test]
    fn path_patterns() {
        assert_eq!(m("/health", "/health"), Some(vec![]));
        assert_eq!(m("/health", "/health/x"), None);
        assert_eq!(m("/health", "/healthz"), None);
        assert_eq!(m("/api/*", "/api/users"), Some(vec![]));
        assert_eq!(m("/api/*", "/api"), Some(vec![]));
        assert_eq!(m("/api/*", "/apiary"), None);
        assert_eq!(m("/*", "/anything/at/all"), Some(vec![]));
        assert_eq!(m("/api*", "/apiary/x"), Some(vec![]));
        assert_eq!(m("/api*", "/ap"), None);
        assert_eq!(
            m("/users/{id}", "/users/42"),
            Some(vec![("id".into(), "42")])
        );
        assert_eq!(m("/users/{id}", "/users/"), None);
        assert_eq!(m("/users/{id}", "/users/42/posts"), None);
        assert_eq!(
            m("/users/{id}/*", "/users/42/posts/1"),
            Some(vec![("id".into(), "42")])
        );
        assert_eq!(
            m("/files/{*rest}", "/files/a/b.txt"),
            Some(vec![("rest".into(), "a/b.txt")])
        );
        assert!(PathPattern::parse("api").is_err());
        assert!(PathPattern::parse("/a/*/b").is_err());
        assert!(PathPattern::parse("/a/x{id}").is_err());
        assert!(PathPattern::parse("/a/{}").is_err());
    }

    #[test]
    fn cidrs() {
        let net: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(net.contains("10.1.2.3".parse().unwrap()));
        assert!(net.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        let one: Cidr = "127.0.0.1".parse().unwrap();
        assert!(one.contains("127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(!v6.contains("10.0.0.1".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nope".parse::<Cidr>().is_err());
    }

    #[test]
    fn hosts_and_sources() {
        assert!(HostMatch::parse("API.example.com").matches("api.example.com:8080"));
        assert!(HostMatch::parse("*.example.com").matches("a.example.com"));
        assert!(!HostMatch::parse("*.example.com").matches("example.com"));
        assert_eq!(strip_port("[::1]:80"), "[::1]");
        assert_eq!(
            ValueSource::parse("header:X-User"),
            Some(ValueSource::Header("x-user".into()))
        );
        assert_eq!(ValueSource::parse("header:"), None);
        assert_eq!(ValueSource::parse("nope"), None);
    }
}
