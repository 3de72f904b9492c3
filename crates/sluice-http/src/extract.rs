//! From an HTTP request to a [`LimitRequest`]: find the route, then read each descriptor
//! entry's value from where the route says.

use std::hash::Hasher;
use std::net::IpAddr;

use http::header::{AUTHORIZATION, COOKIE, HOST};
use http::request::Parts;
use http::{HeaderMap, Request, Uri};
use siphasher::sip128::{Hasher128, SipHasher13};
use sluice_rules::{Gateway, Route, RouteHeaders, ValueSource, strip_port};

use crate::client_ip::push_ip;
use sluice_limiter::limits::{MAX_DESCRIPTORS, MAX_FIELD_LEN};
use sluice_limiter::{HeaderStyle, LimitRequest, RequestDescriptor};

/// What a request is limited by, and how its answer reports it.
#[derive(Debug, Clone)]
pub struct Extracted {
    /// The request for the limiter.
    pub request: LimitRequest,
    /// Which rate-limit fields the answer carries.
    pub style: HeaderStyle,
}

/// The header an API key may come in when there is no bearer token.
const API_KEY_HEADER: &str = "x-api-key";

/// The first route of `gateway` that matches the request, and the descriptors it builds. `None`
/// when no route matches or the route builds no descriptor: the request is not limited.
pub fn extract(gateway: &Gateway, parts: &Parts, client: IpAddr) -> Option<Extracted> {
    let host = host_of(&parts.uri, &parts.headers);
    let path = parts.uri.path();
    gateway.routes.iter().find_map(|route| {
        let params = route.matches(parts.method.as_str(), host, path)?;
        Some(build(route, &params, parts, host, client))
    })?
}

/// The first route of `gateway` that matches the request, found as [`extract`] finds it: how
/// the gateway learns whether a request falls under a route's token budget before deciding it.
pub fn matching_route<'g, B>(gateway: &'g Gateway, request: &Request<B>) -> Option<&'g Route> {
    let host = host_of(request.uri(), request.headers());
    let path = request.uri().path();
    gateway.routes.iter().find(|route| {
        route
            .matches(request.method().as_str(), host, path)
            .is_some()
    })
}

/// The request's host: the URI's authority (h2, absolute-form) or the `Host` header.
fn host_of<'a>(uri: &'a Uri, headers: &'a HeaderMap) -> Option<&'a str> {
    uri.host()
        .or_else(|| headers.get(HOST).and_then(|h| h.to_str().ok()))
}

/// The header style a route asks for.
pub fn style_of(headers: RouteHeaders) -> HeaderStyle {
    match headers {
        RouteHeaders::Ietf => HeaderStyle::Ietf,
        RouteHeaders::Legacy => HeaderStyle::Legacy,
        RouteHeaders::Both => HeaderStyle::Both,
        RouteHeaders::None => HeaderStyle::None,
    }
}

/// Builds the route's descriptors; `None` when none could be built (every one missed a value).
fn build(
    route: &Route,
    params: &[(&str, &str)],
    parts: &Parts,
    host: Option<&str>,
    client: IpAddr,
) -> Option<Extracted> {
    let mut descriptors = Vec::with_capacity(route.descriptors.len());
    'descriptors: for spec in route.descriptors.iter().take(MAX_DESCRIPTORS) {
        let mut entries = Vec::with_capacity(spec.len());
        for entry in spec {
            let value =
                read(&entry.source, params, parts, host, client).or_else(|| entry.default.clone());
            match value {
                Some(v) => entries.push((entry.key.clone(), bounded(v))),
                // As Envoy: a descriptor with a missing value is left out.
                None => continue 'descriptors,
            }
        }
        descriptors.push(RequestDescriptor {
            entries,
            cost: None,
            limit_override: None,
            envoy_hits: false,
            refund: false,
        });
    }
    if descriptors.is_empty() {
        return None;
    }
    Some(Extracted {
        request: LimitRequest {
            domain: route.domain.clone(),
            descriptors,
            cost: route.cost,
        },
        style: style_of(route.headers),
    })
}

/// A value short enough for the limiter. A longer one (a huge header) is replaced by its hash,
/// so it still gets a counter of its own instead of escaping the limit or being refused.
fn bounded(value: String) -> String {
    if value.len() <= MAX_FIELD_LEN {
        return value;
    }
    let mut h = SipHasher13::new_with_keys(0x6c6f_6e67_7661_6c75, 0x736c_7569_6365_0002);
    h.write(value.as_bytes());
    format!("~{:032x}", h.finish128().as_u128())
}

fn read(
    source: &ValueSource,
    params: &[(&str, &str)],
    parts: &Parts,
    host: Option<&str>,
    client: IpAddr,
) -> Option<String> {
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    match source {
        ValueSource::ClientIp => {
            let mut text = String::with_capacity(15);
            push_ip(&mut text, client);
            Some(text)
        }
        ValueSource::Header(name) => header(name),
        ValueSource::Query(name) => query_param(parts.uri.query()?, name),
        ValueSource::Cookie(name) => cookie(parts, name),
        ValueSource::Bearer => bearer(parts),
        ValueSource::ApiKey => bearer(parts).or_else(|| header(API_KEY_HEADER)),
        ValueSource::Path => Some(parts.uri.path().to_owned()),
        ValueSource::PathParam(name) => params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| percent_decode(v)),
        ValueSource::Method => Some(parts.method.as_str().to_owned()),
        ValueSource::Host => host.map(|h| strip_port(h).to_ascii_lowercase()),
        ValueSource::Constant(v) => Some(v.clone()),
    }
    .filter(|v| !v.is_empty())
}

fn bearer(parts: &Parts) -> Option<String> {
    let value = parts.headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_owned())
}

fn cookie(parts: &Parts, name: &str) -> Option<String> {
    parts
        .headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim_matches('"').to_owned())
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query
        .split('&')
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .find(|(k, _)| percent_decode(k) == name)
        .map(|(_, v)| percent_decode(v))
}

/// Decodes `%XX` escapes and `+` (as a space, for query strings); malformed escapes are kept
/// as written, and bytes that are not UTF-8 are replaced.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, headers: &[(&'static str, &'static str)]) -> Parts {
        let mut b = http::Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn sources() {
        let p = parts(
            "http://h.example:8080/u/a%20b?plan=gold&x=1&q=a+b",
            &[
                ("authorization", "Bearer tok123"),
                ("cookie", "a=1; session=s%3D; b=2"),
                ("x-api-key", "key9"),
            ],
        );
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let r = |s: ValueSource| read(&s, &[("id", "a%20b")], &p, Some("H.example:8080"), ip);
        assert_eq!(r(ValueSource::ClientIp).as_deref(), Some("192.0.2.1"));
        assert_eq!(
            r(ValueSource::Query("plan".into())).as_deref(),
            Some("gold")
        );
        assert_eq!(r(ValueSource::Query("q".into())).as_deref(), Some("a b"));
        assert_eq!(r(ValueSource::Query("none".into())), None);
        assert_eq!(
            r(ValueSource::Cookie("session".into())).as_deref(),
            Some("s%3D")
        );
        assert_eq!(r(ValueSource::Bearer).as_deref(), Some("tok123"));
        assert_eq!(r(ValueSource::ApiKey).as_deref(), Some("tok123"));
        assert_eq!(
            r(ValueSource::PathParam("id".into())).as_deref(),
            Some("a b")
        );
        assert_eq!(r(ValueSource::Host).as_deref(), Some("h.example"));
        assert_eq!(r(ValueSource::Method).as_deref(), Some("GET"));
        let no_bearer = parts("/", &[("x-api-key", "key9")]);
        assert_eq!(
            read(&ValueSource::ApiKey, &[], &no_bearer, None, ip).as_deref(),
            Some("key9")
        );
    }

    #[test]
    fn long_values_are_hashed_not_refused() {
        let long = "x".repeat(MAX_FIELD_LEN + 1);
        let b = bounded(long.clone());
        assert!(b.len() < MAX_FIELD_LEN && b.starts_with('~'));
        assert_eq!(b, bounded(long));
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%4"), "%4");
        assert_eq!(percent_decode("%41%zz"), "A%zz");
    }
    #[test]
    fn the_matching_route_is_the_first_that_matches_even_without_descriptors() {
        let rules = sluice_rules::RuleSet::parse(
            "gw.yaml",
            "domain: gw\nroutes:\n  - {name: a, path: /a, methods: [POST]}\n  - {name: any, path: /*}\n",
        )
        .unwrap();
        let gateway = rules.gateway().unwrap();
        let name = |method: &str, uri: &str| {
            let mut p = parts(uri, &[]);
            p.method = method.parse().unwrap();
            matching_route(gateway, &Request::from_parts(p, ())).map(|r| r.name.to_string())
        };
        assert_eq!(name("POST", "/a").as_deref(), Some("a"));
        assert_eq!(name("GET", "/a").as_deref(), Some("any"));
        assert_eq!(
            name("GET", "http://h.example/b?x=1").as_deref(),
            Some("any")
        );
    }
}
