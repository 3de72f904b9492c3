//! Decoding the gateway section: `routes` and `trusted_proxies`, located like every other field.

use super::Decoder;
use super::fields::Fields;
use crate::error::ErrorKind;
use crate::gateway::{
    Cidr, DEFAULT_MAX_BODY, EntrySpec, Gateway, HostMatch, JsonPath, PathPattern, ReserveFrom,
    Route, RouteHeaders, RouteUsage, ValueSource,
};
use crate::yaml::{Node, NodeKind};

const ROUTE_FIELDS: &[&str] = &[
    "name",
    "path",
    "methods",
    "host",
    "domain",
    "descriptors",
    "cost",
    "headers",
    "usage",
];
const USAGE_FIELDS: &[&str] = &["reserve", "settle", "ttl"];
const RESERVE_FIELDS: &[&str] = &["from", "default", "max", "max_body"];
const SETTLE_FIELDS: &[&str] = &["from"];
/// Where usage is read when a route does not say: the OpenAI shape, which most LLM APIs and
/// their gateways answer in.
const DEFAULT_SETTLE_PATH: &str = "usage.total_tokens";
/// The largest amount one reservation may take (the limiter's bound).
const MAX_RESERVATION: u64 = u32::MAX as u64;
const ENTRY_FIELDS: &[&str] = &["key", "from", "value", "default"];

impl Decoder {
    /// The gateway section of the top level, if the file has one. `domain` is the file's domain,
    /// which routes use unless they name another.
    pub(super) fn gateway(&mut self, fields: &Fields<'_>, domain: &str) -> Option<Gateway> {
        let routes_node = fields.get("routes");
        let proxies_node = fields.get("trusted_proxies");
        let first = routes_node.or(proxies_node)?;
        let mut gateway = Gateway {
            location: Some(self.at(first)),
            ..Gateway::default()
        };
        if let Some(node) = routes_node.filter(|n| !n.is_null()) {
            match &node.kind {
                NodeKind::Seq(items) => {
                    for (i, item) in items.iter().enumerate() {
                        gateway.routes.extend(self.route(item, i, domain));
                    }
                }
                _ => self.wrong_type("routes", node, "a list of routes"),
            }
        }
        if let Some(node) = proxies_node.filter(|n| !n.is_null()) {
            for item in self.string_list("trusted_proxies", node) {
                let text = self.string("trusted_proxies", item);
                match text.as_deref().map(str::parse::<Cidr>) {
                    Some(Ok(cidr)) => gateway.trusted_proxies.push(cidr),
                    Some(Err(reason)) => {
                        let kind = ErrorKind::Invalid {
                            field: "trusted_proxies".into(),
                            value: text.unwrap_or_default(),
                            reason,
                        };
                        self.error(item, kind);
                    }
                    None => {}
                }
            }
        }
        Some(gateway)
    }

    fn route(&mut self, node: &Node, index: usize, file_domain: &str) -> Option<Route> {
        let fields = self.mapping("route", node, "a route", ROUTE_FIELDS)?;
        let path = match fields.get("path") {
            Some(n) => {
                let text = self.name("path", n)?;
                match PathPattern::parse(&text) {
                    Ok(p) => Some(p),
                    Err(reason) => {
                        let kind = ErrorKind::Invalid {
                            field: "path".into(),
                            value: text,
                            reason,
                        };
                        self.error(n, kind);
                        return None;
                    }
                }
            }
            None => None,
        };
        let mut methods = Vec::new();
        if let Some(n) = fields.get("methods") {
            for m in self.string_list("methods", n) {
                let method = self.name("methods", m)?;
                if !method.bytes().all(|b| b.is_ascii_alphabetic() || b == b'-') {
                    let kind = ErrorKind::Invalid {
                        field: "methods".into(),
                        value: method,
                        reason: "a method is a word such as GET or POST",
                    };
                    self.error(m, kind);
                    return None;
                }
                methods.push(method.to_ascii_uppercase());
            }
        }
        let host = match fields.get("host") {
            Some(n) => Some(HostMatch::parse(&self.name("host", n)?)),
            None => None,
        };
        let domain = match fields.get("domain") {
            Some(n) => self.name("domain", n)?,
            None => file_domain.to_owned(),
        };
        let cost = match fields.get("cost") {
            Some(n) => self.uint("cost", n)?,
            None => 1,
        };
        let headers = match fields.get("headers") {
            Some(n) => match self.variant("headers", n, &RouteHeaders::NAMES)? {
                "legacy" => RouteHeaders::Legacy,
                "both" => RouteHeaders::Both,
                "none" => RouteHeaders::None,
                _ => RouteHeaders::Ietf,
            },
            None => RouteHeaders::Ietf,
        };
        let usage = match fields.get("usage").filter(|n| !n.is_null()) {
            Some(n) => Some(std::sync::Arc::new(self.usage(n)?)),
            None => None,
        };
        let params: Vec<&str> = path
            .as_ref()
            .map(|p| p.params().collect())
            .unwrap_or_default();
        let mut descriptors = Vec::new();
        let mut ok = true;
        if let Some(n) = fields.get("descriptors").filter(|n| !n.is_null()) {
            let NodeKind::Seq(items) = &n.kind else {
                self.wrong_type(
                    "descriptors",
                    n,
                    "a list of descriptors, each a list of entries",
                );
                return None;
            };
            for item in items {
                let NodeKind::Seq(entries) = &item.kind else {
                    self.wrong_type("descriptors[]", item, "a list of entries");
                    ok = false;
                    continue;
                };
                if entries.is_empty() {
                    self.error(item, ErrorKind::EmptyString("descriptors[]"));
                    ok = false;
                    continue;
                }
                let mut descriptor = Vec::with_capacity(entries.len());
                for e in entries {
                    match self.entry(e, &params) {
                        Some(spec) => descriptor.push(spec),
                        None => ok = false,
                    }
                }
                descriptors.push(descriptor);
            }
        }
        let name = match fields.get("name") {
            Some(n) => self.name("name", n)?,
            None => path
                .as_ref()
                .map_or_else(|| format!("route {}", index + 1), |p| p.to_string()),
        };
        ok.then(|| Route {
            name: name.into(),
            path,
            methods,
            host,
            domain,
            descriptors,
            cost,
            headers,
            usage,
            location: self.at(node),
        })
    }

    /// A route's `usage`: `reserve` (required), `settle` and `ttl`.
    fn usage(&mut self, node: &Node) -> Option<RouteUsage> {
        let fields = self.mapping("usage", node, "a route's usage", USAGE_FIELDS)?;
        let reserve = match fields.get("reserve") {
            Some(n) => self.reserve(n),
            None => {
                self.missing(&fields, node, "reserve", "a route's usage");
                None
            }
        };
        let settle = match fields.get("settle").filter(|n| !n.is_null()) {
            Some(n) => {
                let settle = self.mapping("settle", n, "a route's usage settle", SETTLE_FIELDS)?;
                match settle.get("from") {
                    Some(f) => self.json_path(f),
                    None => {
                        self.missing(&settle, n, "from", "a route's usage settle");
                        None
                    }
                }
            }
            None => JsonPath::parse(DEFAULT_SETTLE_PATH),
        };
        let ttl = match fields.get("ttl") {
            Some(n) => {
                let ttl = self.duration("ttl", n)?;
                if ttl.is_zero() {
                    let kind = ErrorKind::Invalid {
                        field: "ttl".into(),
                        value: "0".into(),
                        reason: "a reservation must hold for some time, such as 5m",
                    };
                    self.error(n, kind);
                    return None;
                }
                Some(ttl)
            }
            None => None,
        };
        Some(RouteUsage {
            reserve: reserve?,
            settle: settle?,
            ttl,
        })
    }

    /// `reserve`: where the estimate comes from, its default, its maximum and the body bound.
    fn reserve(&mut self, node: &Node) -> Option<ReserveFrom> {
        let fields = self.mapping("reserve", node, "a route's usage reserve", RESERVE_FIELDS)?;
        let from = match fields.get("from") {
            Some(n) => Some(self.json_path(n)?),
            None => None,
        };
        let max = match fields.get("max") {
            Some(n) => Some(self.amount("max", n)?),
            None => None,
        };
        let default = match fields.get("default") {
            Some(n) => Some(self.amount("default", n)?),
            None => None,
        };
        let max_body = match fields.get("max_body") {
            Some(n) => {
                let bytes = self.uint("max_body", n)?;
                if bytes == 0 {
                    let kind = ErrorKind::OutOfRange {
                        field: "max_body".into(),
                        value: "0".into(),
                        range: "the range of 1 byte or more",
                    };
                    self.error(n, kind);
                    return None;
                }
                bytes
            }
            None => DEFAULT_MAX_BODY,
        };
        // Without a default, a request without the field reserves the most it may: never less
        // than it could use.
        let Some(default) = default.or(max) else {
            self.missing(
                &fields,
                node,
                "default",
                "a route's usage reserve without `max`",
            );
            return None;
        };
        let max = max.unwrap_or(MAX_RESERVATION);
        if default > max {
            let kind = ErrorKind::OutOfRange {
                field: "default".into(),
                value: default.to_string(),
                range: "the range of 1 to `max`, the largest estimate",
            };
            self.error(fields.get("default").unwrap_or(node), kind);
            return None;
        }
        Some(ReserveFrom {
            from,
            default,
            max,
            max_body,
        })
    }

    /// An amount of units one reservation may take: from 1 to `u32::MAX`.
    fn amount(&mut self, field: &'static str, node: &Node) -> Option<u64> {
        let n = self.uint(field, node)?;
        if n == 0 || n > MAX_RESERVATION {
            let kind = ErrorKind::OutOfRange {
                field: field.into(),
                value: n.to_string(),
                range: "the range of 1 to 4294967295, the most one reservation takes",
            };
            self.error(node, kind);
            return None;
        }
        Some(n)
    }

    fn json_path(&mut self, node: &Node) -> Option<JsonPath> {
        let text = self.name("from", node)?;
        match JsonPath::parse(&text) {
            Some(p) => Some(p),
            None => {
                let kind = ErrorKind::Invalid {
                    field: "from".into(),
                    value: text,
                    reason: JsonPath::FORM,
                };
                self.error(node, kind);
                None
            }
        }
    }

    fn entry(&mut self, node: &Node, params: &[&str]) -> Option<EntrySpec> {
        let fields = self.mapping("entry", node, "a route's descriptor entry", ENTRY_FIELDS)?;
        let key = match fields.get("key") {
            Some(n) => self.name("key", n),
            None => {
                self.missing(&fields, node, "key", "a descriptor entry");
                None
            }
        };
        let source = match (fields.get("from"), fields.get("value")) {
            (Some(_), Some(v)) => {
                let kind = ErrorKind::Conflict {
                    first: "from",
                    second: "value",
                    hint: "`value` is a constant, `from` reads the request; keep one",
                };
                self.error(v, kind);
                None
            }
            (None, Some(v)) => self.string("value", v).map(ValueSource::Constant),
            (Some(f), None) => {
                let text = self.name("from", f)?;
                match ValueSource::parse(&text) {
                    Some(ValueSource::PathParam(p)) if !params.contains(&p.as_str()) => {
                        let kind = ErrorKind::Undefined {
                            what: "path parameter",
                            name: p,
                            hint: "name it in the route's path, such as `/users/{id}`",
                        };
                        self.error(f, kind);
                        None
                    }
                    Some(s) => Some(s),
                    None => {
                        let kind = ErrorKind::UnknownVariant {
                            what: "value source",
                            suggestion: crate::suggest::closest(&text, &ValueSource::FORMS),
                            value: text,
                            expected: &ValueSource::FORMS,
                        };
                        self.error(f, kind);
                        None
                    }
                }
            }
            (None, None) => {
                self.missing(&fields, node, "from", "a descriptor entry");
                None
            }
        };
        let default = match fields.get("default") {
            Some(n) => Some(self.string("default", n)?),
            None => None,
        };
        Some(EntrySpec {
            key: key?,
            source: source?,
            default,
        })
    }
}
