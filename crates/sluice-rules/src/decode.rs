//! Decoding the located YAML tree into the rule model, by hand, so every error has a position.
//!
//! The decoder keeps going after an error where it can, collecting every problem in the file, so
//! `sluice validate` shows them all at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::{
    Algorithm, Alignment, FixedWindow, Gcra, LeakyQueue, Policy, PolicyError, Rate, SlidingCounter,
    SlidingLog, TokenBucket,
};

use crate::duration::parse_duration;
use crate::error::{ConfigError, ErrorKind, LoadError, Location};
use crate::model::{
    Action, DescriptorConfig, DomainConfig, LimitConfig, OnStoreError, Unit, ValueMatch,
};
use crate::suggest::closest;
use crate::yaml::{self, Node, NodeKind, parse_bool};

mod routes;

const DOMAIN_FIELDS: &[&str] = &[
    "domain",
    "descriptors",
    "action",
    "on_store_error",
    "routes",
    "trusted_proxies",
];
const DESCRIPTOR_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "limits",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "share_threshold",
    "action",
    "on_store_error",
];
const LIMIT_FIELDS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "window",
    "algorithm",
    "burst",
    "queue_size",
    "max_wait",
    "alignment",
    "utc_offset",
    "action",
    "on_store_error",
];
const REPLACES_FIELDS: &[&str] = &["name"];
const ACTIONS: &[&str] = &["reject", "shadow", "fake", "delay", "soft"];
const FAKE_FIELDS: &[&str] = &["status", "content_type", "body"];
const DELAY_FIELDS: &[&str] = &["max_wait"];
const SOFT_FIELDS: &[&str] = &["header"];
const EMPTY_FIELDS: &[&str] = &[];
const ALIGNMENTS: &[&str] = &["clock", "first_request"];
const ALGORITHM_NAMES: &[&str] = &[
    "token_bucket",
    "gcra",
    "leaky_queue",
    "fixed_window",
    "sliding_log",
    "sliding_counter",
];

/// The body type of a `fake` answer when none is given.
pub(crate) const DEFAULT_FAKE_CONTENT_TYPE: &str = "text/plain; charset=utf-8";
/// The warning header of a `soft` action when none is given.
pub(crate) const DEFAULT_SOFT_HEADER: &str = "X-RateLimit-Warning";
/// The largest UTC offset accepted, in seconds: real zones span -12:00 to +14:00.
const MAX_UTC_OFFSET_SECS: i64 = 18 * 3600;

/// Reads one rule file's text into its domain.
pub(crate) fn decode_file(file: &Arc<str>, text: &str) -> Result<DomainConfig, LoadError> {
    let root = yaml::parse(file, text)?;
    let Some(root) = root else {
        return Err(ConfigError::new(Location::start_of(file.clone()), ErrorKind::Empty).into());
    };
    let mut decoder = Decoder {
        file: file.clone(),
        errors: Vec::new(),
    };
    let domain = decoder.domain(&root);
    match domain {
        Some(d) if decoder.errors.is_empty() => Ok(d),
        _ => {
            decoder
                .errors
                .sort_by_key(|e| (e.location.line, e.location.col));
            Err(LoadError::new(decoder.errors))
        }
    }
}

/// The fields of one mapping, checked against the names it accepts.
struct Fields<'n> {
    entries: Vec<(&'static str, &'n Node)>,
    /// Whether the mapping held an unknown field. A misspelled field is then likely the
    /// "missing" one, so missing-field errors are not reported on top of it.
    had_unknown: bool,
}

impl<'n> Fields<'n> {
    fn get(&self, name: &str) -> Option<&'n Node> {
        self.entries
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, node)| *node)
    }
}

/// Settings a descriptor passes to its limits and children, each overridable lower down.
#[derive(Clone)]
struct Inherited {
    action: Option<Action>,
    on_store_error: Option<OnStoreError>,
}

struct Decoder {
    file: Arc<str>,
    errors: Vec<ConfigError>,
}

/// What one limit entry turned out to be.
enum LimitEntry {
    Unlimited(Location),
    Limit(LimitConfig),
}

impl Decoder {
    fn at(&self, node: &Node) -> Location {
        node.location(&self.file)
    }

    fn error(&mut self, node: &Node, kind: ErrorKind) {
        let location = self.at(node);
        self.errors.push(ConfigError::new(location, kind));
    }

    fn wrong_type(&mut self, field: &str, node: &Node, expected: &'static str) {
        let kind = ErrorKind::WrongType {
            field: field.to_owned(),
            expected,
            found: node.describe(),
        };
        self.error(node, kind);
    }

    /// Checks that `node` is a mapping of known, unique, scalar keys.
    fn mapping<'n>(
        &mut self,
        field: &str,
        node: &'n Node,
        context: &'static str,
        expected: &'static [&'static str],
    ) -> Option<Fields<'n>> {
        let NodeKind::Map(entries) = &node.kind else {
            self.wrong_type(field, node, "a mapping");
            return None;
        };
        let mut fields = Fields {
            entries: Vec::with_capacity(entries.len()),
            had_unknown: false,
        };
        let mut first_lines: HashMap<&'static str, usize> = HashMap::new();
        for (key, value) in entries {
            let NodeKind::Scalar { text, .. } = &key.kind else {
                self.wrong_type("a key", key, "a string");
                continue;
            };
            let Some(name) = expected.iter().copied().find(|e| *e == text) else {
                let kind = ErrorKind::UnknownField {
                    field: text.clone(),
                    context,
                    suggestion: closest(text, expected),
                    expected,
                };
                self.error(key, kind);
                fields.had_unknown = true;
                continue;
            };
            if let Some(first_line) = first_lines.get(name) {
                let kind = ErrorKind::DuplicateField {
                    field: name.to_owned(),
                    first_line: *first_line,
                };
                self.error(key, kind);
                continue;
            }
            first_lines.insert(name, key.line);
            fields.entries.push((name, value));
        }
        Some(fields)
    }

    /// Reports a missing field, unless the mapping's unknown field already explains it.
    fn missing(
        &mut self,
        fields: &Fields<'_>,
        node: &Node,
        field: &'static str,
        context: &'static str,
    ) {
        if !fields.had_unknown {
            self.error(node, ErrorKind::MissingField { field, context });
        }
    }

    /// A string: any scalar, as YAML reads `value: 123` into a string field.
    fn string(&mut self, field: &str, node: &Node) -> Option<String> {
        match &node.kind {
            NodeKind::Scalar { text, .. } if !node.is_null() => Some(text.clone()),
            _ => {
                self.wrong_type(field, node, "a string");
                None
            }
        }
    }

    /// A string that must not be empty.
    fn name(&mut self, field: &'static str, node: &Node) -> Option<String> {
        let s = self.string(field, node)?;
        if s.is_empty() {
            self.error(node, ErrorKind::EmptyString(field));
            return None;
        }
        Some(s)
    }

    fn uint(&mut self, field: &str, node: &Node) -> Option<u64> {
        let text = match &node.kind {
            NodeKind::Scalar { text, plain: true } => text.as_str(),
            _ => {
                self.wrong_type(field, node, "a whole number");
                return None;
            }
        };
        let digits = text.strip_prefix('+').unwrap_or(text);
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            return match digits.parse::<u64>() {
                Ok(n) => Some(n),
                Err(_) => {
                    let kind = ErrorKind::TooLarge {
                        field: field.to_owned(),
                        value: text.to_owned(),
                        max: u64::MAX,
                    };
                    self.error(node, kind);
                    None
                }
            };
        }
        let negative = text
            .strip_prefix('-')
            .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit() || b == b'.'));
        if negative {
            let kind = ErrorKind::Negative {
                field: field.to_owned(),
                value: text.to_owned(),
            };
            self.error(node, kind);
            return None;
        }
        self.wrong_type(field, node, "a whole number");
        None
    }

    fn boolean(&mut self, field: &str, node: &Node) -> Option<bool> {
        if let NodeKind::Scalar { text, plain: true } = &node.kind {
            if let Some(b) = parse_bool(text) {
                return Some(b);
            }
        }
        self.wrong_type(field, node, "true or false");
        None
    }

    fn duration(&mut self, field: &str, node: &Node) -> Option<Duration> {
        let NodeKind::Scalar { text, .. } = &node.kind else {
            self.wrong_type(field, node, "a duration such as 30s");
            return None;
        };
        let parsed = parse_duration(text);
        if parsed.is_none() {
            let kind = ErrorKind::InvalidDuration {
                value: text.clone(),
            };
            self.error(node, kind);
        }
        parsed
    }

    /// One of a fixed set of words.
    fn variant(
        &mut self,
        what: &'static str,
        node: &Node,
        expected: &'static [&'static str],
    ) -> Option<&'static str> {
        let text = self.string(what, node)?;
        let found = expected.iter().copied().find(|e| *e == text);
        if found.is_none() {
            let kind = ErrorKind::UnknownVariant {
                what,
                suggestion: closest(&text, expected),
                value: text,
                expected,
            };
            self.error(node, kind);
        }
        found
    }

    fn domain(&mut self, root: &Node) -> Option<DomainConfig> {
        let fields = self.mapping("the document", root, "the top level", DOMAIN_FIELDS)?;
        let name_node = fields.get("domain");
        let name = match name_node {
            Some(n) => self.name("domain", n),
            None => {
                self.missing(&fields, root, "domain", "a rule file");
                None
            }
        };
        let inherited = Inherited {
            action: fields.get("action").and_then(|n| self.action(n)),
            on_store_error: fields
                .get("on_store_error")
                .and_then(|n| self.on_store_error(n)),
        };
        let descriptors = match fields.get("descriptors") {
            Some(node) => self.descriptor_list(node, &inherited),
            None => Vec::new(),
        };
        let gateway = name
            .as_deref()
            .and_then(|domain| self.gateway(&fields, domain));
        Some(DomainConfig {
            name: name?,
            location: self.at(name_node?),
            descriptors,
            gateway,
        })
    }

    fn descriptor_list(&mut self, node: &Node, inherited: &Inherited) -> Vec<DescriptorConfig> {
        if node.is_null() {
            return Vec::new();
        }
        let NodeKind::Seq(items) = &node.kind else {
            self.wrong_type("descriptors", node, "a list of descriptors");
            return Vec::new();
        };
        let mut seen: HashMap<(String, ValueMatch), usize> = HashMap::new();
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let Some(d) = self.descriptor(item, inherited) else {
                continue;
            };
            let identity = (d.key.clone(), d.value.clone());
            if let Some(first_line) = seen.get(&identity) {
                let what = match &d.value {
                    ValueMatch::Any => format!("`{}` (no value)", d.key),
                    v => format!("`{}: {v}`", d.key),
                };
                let kind = ErrorKind::DuplicateDescriptor {
                    what,
                    first_line: *first_line,
                };
                self.error(item, kind);
                continue;
            }
            seen.insert(identity, item.line);
            out.push(d);
        }
        out
    }

    fn descriptor(&mut self, node: &Node, inherited: &Inherited) -> Option<DescriptorConfig> {
        let fields = self.mapping("descriptor", node, "a descriptor", DESCRIPTOR_FIELDS)?;
        let key = match fields.get("key") {
            Some(n) => self.name("key", n),
            None => {
                self.missing(&fields, node, "key", "a descriptor");
                None
            }
        };
        let value = match fields.get("value") {
            None => Some(ValueMatch::Any),
            Some(n) if n.is_null() => Some(ValueMatch::Any),
            Some(n) => self.string("value", n).map(|v| value_match(&v)),
        };
        let flag = |d: &mut Self, name: &str| {
            fields
                .get(name)
                .and_then(|n| d.boolean(name, n))
                .unwrap_or(false)
        };
        let shadow_mode = flag(self, "shadow_mode");
        let detailed_metric = flag(self, "detailed_metric");
        let share_threshold = flag(self, "share_threshold");
        let mut here = inherited.clone();
        if let Some(n) = fields.get("action") {
            here.action = self.action(n).or(here.action);
        }
        if let Some(n) = fields.get("on_store_error") {
            here.on_store_error = self.on_store_error(n).or(here.on_store_error);
        }

        let mut entries = Vec::new();
        match (fields.get("rate_limit"), fields.get("limits")) {
            (Some(_), Some(limits)) => {
                let kind = ErrorKind::Conflict {
                    first: "rate_limit",
                    second: "limits",
                    hint: "move the rate_limit into the limits list",
                };
                self.error(limits, kind);
            }
            (Some(rl), None) if !rl.is_null() => {
                entries.extend(self.limit("rate_limit", rl, &here, shadow_mode));
            }
            (None, Some(limits)) if !limits.is_null() => match &limits.kind {
                NodeKind::Seq(items) => {
                    for item in items {
                        entries.extend(self.limit("limits", item, &here, shadow_mode));
                    }
                }
                _ => self.wrong_type("limits", limits, "a list of limits"),
            },
            _ => {}
        }
        let mut limits: Vec<LimitConfig> = Vec::with_capacity(entries.len());
        let mut unlimited = false;
        let count = entries.len();
        for entry in entries {
            match entry {
                LimitEntry::Unlimited(location) => {
                    unlimited = true;
                    if count > 1 {
                        let kind = ErrorKind::Conflict {
                            first: "unlimited",
                            second: "limits",
                            hint: "an unlimited descriptor carries no other limit",
                        };
                        self.errors.push(ConfigError::new(location, kind));
                    }
                }
                LimitEntry::Limit(limit) => {
                    if let Some(first) = limits.iter().find(|l| l.policy == limit.policy) {
                        let kind = ErrorKind::DuplicateLimit {
                            first_line: first.location.line,
                        };
                        self.errors
                            .push(ConfigError::new(limit.location.clone(), kind));
                        continue;
                    }
                    limits.push(limit);
                }
            }
        }
        let descriptors = match fields.get("descriptors") {
            Some(n) => self.descriptor_list(n, &here),
            None => Vec::new(),
        };
        Some(DescriptorConfig {
            key: key?,
            value: value?,
            location: self.at(node),
            limits,
            unlimited,
            detailed_metric,
            share_threshold,
            descriptors,
        })
    }

    fn limit(
        &mut self,
        field: &str,
        node: &Node,
        inherited: &Inherited,
        shadow_mode: bool,
    ) -> Option<LimitEntry> {
        let fields = self.mapping(field, node, "a limit", LIMIT_FIELDS)?;
        let unlimited = fields
            .get("unlimited")
            .and_then(|n| self.boolean("unlimited", n))
            .unwrap_or(false);
        if unlimited {
            // Envoy refuses a unit on an unlimited limit, so Sluice does too, and extends the
            // refusal to every field that would shape a policy that never applies.
            for param in [
                "unit",
                "window",
                "algorithm",
                "burst",
                "queue_size",
                "max_wait",
            ] {
                if let Some(n) = fields.get(param) {
                    let kind = ErrorKind::Conflict {
                        first: "unlimited",
                        second: param_name(param),
                        hint: "an unlimited descriptor has no limit to shape; remove one",
                    };
                    self.error(n, kind);
                }
            }
            return Some(LimitEntry::Unlimited(self.at(node)));
        }

        let name = fields.get("name").and_then(|n| self.name("name", n));
        let replaces = fields
            .get("replaces")
            .map(|n| self.replaces(n, name.as_deref()))
            .unwrap_or_default();

        let algorithm_node = fields.get("algorithm");
        let algorithm = match algorithm_node {
            None => Some(Algorithm::FixedWindow),
            Some(n) => self.algorithm(n),
        };

        let window = match (fields.get("unit"), fields.get("window")) {
            (Some(_), Some(w)) => {
                let kind = ErrorKind::Conflict {
                    first: "unit",
                    second: "window",
                    hint: "keep `unit` for Envoy's fixed units, or `window` for any length",
                };
                self.error(w, kind);
                None
            }
            (Some(u), None) => self.unit(u).map(|unit| (unit.duration(), u)),
            (None, Some(w)) => self.duration("window", w).map(|d| (d, w)),
            (None, None) => {
                self.missing(
                    &fields,
                    node,
                    "unit",
                    "a limit (or `window`, or `unlimited: true`)",
                );
                None
            }
        };
        let rpu_node = fields.get("requests_per_unit");
        let requests = match rpu_node {
            Some(n) => self.uint("requests_per_unit", n),
            None => {
                self.missing(&fields, node, "requests_per_unit", "a limit");
                None
            }
        };

        let mut params = Params::default();
        for param in ["burst", "queue_size", "max_wait", "alignment", "utc_offset"] {
            let Some(n) = fields.get(param) else { continue };
            if let Some(algorithm) = algorithm.filter(|a| !param_applies(param, *a)) {
                let kind = ErrorKind::ParamNotForAlgorithm {
                    param: param_name(param),
                    algorithm: algorithm.name(),
                    applies_to: applies_to(param),
                };
                self.error(n, kind);
                continue;
            }
            match param {
                "burst" => params.burst = self.uint("burst", n),
                "queue_size" => params.queue_size = self.uint("queue_size", n),
                "max_wait" => params.max_wait = self.duration("max_wait", n),
                "alignment" => params.first_request = self.alignment(n),
                _ => params.utc_offset = self.utc_offset(n).map(|o| (o, n)),
            }
        }
        if let (Some(true), Some((_, n))) = (params.first_request, params.utc_offset) {
            let kind = ErrorKind::Conflict {
                first: "alignment: first_request",
                second: "utc_offset",
                hint: "a UTC offset only places clock-aligned windows",
            };
            self.error(n, kind);
        }

        let mut action = match fields.get("action") {
            Some(n) => self.action(n),
            None => None,
        };
        if action.is_none() {
            action = inherited.action.clone();
        }
        let on_store_error = fields
            .get("on_store_error")
            .and_then(|n| self.on_store_error(n))
            .or(inherited.on_store_error)
            .unwrap_or_default();

        let (algorithm, (window, window_node), requests, rpu_node) =
            (algorithm?, window?, requests?, rpu_node?);
        let policy = match build_policy(algorithm, window, requests, &params) {
            Ok(p) => p,
            Err(e) => {
                let at = match e {
                    PolicyError::ZeroDuration {
                        what: "maximum wait",
                    } => fields.get("max_wait").unwrap_or(window_node),
                    PolicyError::ZeroDuration { .. } => window_node,
                    PolicyError::ZeroRate { .. } | PolicyError::LimitTooLarge { .. } => rpu_node,
                };
                self.error(at, ErrorKind::Policy(e));
                return None;
            }
        };
        let action = action.unwrap_or(match algorithm {
            // A shaper's point is to delay, so a queue delays unless told otherwise.
            Algorithm::LeakyQueue => Action::Delay { max_wait: None },
            _ => Action::Reject,
        });
        Some(LimitEntry::Limit(LimitConfig {
            name: name.map(Arc::from),
            shadow: shadow_mode || action == Action::Shadow,
            policy: Arc::new(policy),
            replaces,
            action,
            on_store_error,
            location: self.at(node),
        }))
    }

    fn replaces(&mut self, node: &Node, own_name: Option<&str>) -> Vec<Arc<str>> {
        let NodeKind::Seq(items) = &node.kind else {
            self.wrong_type("replaces", node, "a list of `name:` entries");
            return Vec::new();
        };
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            // Envoy writes `- name: foo`; a bare `- foo` is accepted as the same thing.
            let name = match &item.kind {
                NodeKind::Scalar { .. } => self.name("replaces", item),
                _ => {
                    let Some(f) =
                        self.mapping("replaces", item, "a replaces entry", REPLACES_FIELDS)
                    else {
                        continue;
                    };
                    match f.get("name") {
                        Some(n) => self.name("name", n),
                        None => {
                            self.missing(&f, item, "name", "a replaces entry");
                            None
                        }
                    }
                }
            };
            let Some(name) = name else { continue };
            if Some(name.as_str()) == own_name {
                self.error(item, ErrorKind::ReplacesItself(name));
                continue;
            }
            out.push(Arc::from(name));
        }
        out
    }

    fn unit(&mut self, node: &Node) -> Option<Unit> {
        let text = self.string("unit", node)?;
        let unit = Unit::parse(&text);
        if unit.is_none() {
            let kind = ErrorKind::UnknownUnit {
                suggestion: closest(&text.to_ascii_lowercase(), &Unit::NAMES),
                unit: text,
            };
            self.error(node, kind);
        }
        unit
    }

    fn algorithm(&mut self, node: &Node) -> Option<Algorithm> {
        let text = self.string("algorithm", node)?;
        match text.parse::<Algorithm>() {
            Ok(a) => Some(a),
            Err(_) => {
                let kind = ErrorKind::UnknownAlgorithm {
                    suggestion: closest(&text, ALGORITHM_NAMES),
                    name: text,
                };
                self.error(node, kind);
                None
            }
        }
    }

    /// `Some(true)` for first-request alignment.
    fn alignment(&mut self, node: &Node) -> Option<bool> {
        self.variant("alignment", node, ALIGNMENTS)
            .map(|a| a == "first_request")
    }

    fn utc_offset(&mut self, node: &Node) -> Option<i32> {
        let NodeKind::Scalar { text, plain } = &node.kind else {
            self.wrong_type("utc_offset", node, "an offset such as +03:00");
            return None;
        };
        let secs = match text.parse::<i64>() {
            Ok(n) if *plain => Some(n),
            _ => parse_utc_offset(text),
        };
        match secs {
            Some(s) if s.abs() <= MAX_UTC_OFFSET_SECS => i32::try_from(s).ok(),
            _ => {
                let kind = ErrorKind::InvalidUtcOffset {
                    value: text.clone(),
                };
                self.error(node, kind);
                None
            }
        }
    }

    fn on_store_error(&mut self, node: &Node) -> Option<OnStoreError> {
        match self.variant("on_store_error", node, &OnStoreError::NAMES)? {
            "deny" => Some(OnStoreError::Deny),
            "local" => Some(OnStoreError::Local),
            _ => Some(OnStoreError::Allow),
        }
    }

    /// `action: reject`, or a one-key mapping with the action's parameters:
    /// `action: {fake: {status: 200, body: "ok"}}`.
    fn action(&mut self, node: &Node) -> Option<Action> {
        let (kind, params) = match &node.kind {
            NodeKind::Scalar { .. } => (self.variant("action", node, ACTIONS)?, None),
            NodeKind::Map(entries) if entries.len() == 1 => {
                let (k, v) = &entries[0];
                (self.variant("action", k, ACTIONS)?, Some(v))
            }
            _ => {
                self.wrong_type("action", node, "an action name, or a mapping of one action");
                return None;
            }
        };
        let params = params.filter(|p| !p.is_null());
        let expected = match kind {
            "fake" => FAKE_FIELDS,
            "delay" => DELAY_FIELDS,
            "soft" => SOFT_FIELDS,
            _ => EMPTY_FIELDS,
        };
        let fields = match params {
            Some(p) => Some(self.mapping(kind, p, "the action's parameters", expected)?),
            None => None,
        };
        let get = |name: &str| fields.as_ref().and_then(|f| f.get(name));
        Some(match kind {
            "reject" => Action::Reject,
            "shadow" => Action::Shadow,
            "fake" => {
                let status = match get("status") {
                    Some(n) => {
                        let s = self.uint("status", n)?;
                        if !(100..=599).contains(&s) {
                            let kind = ErrorKind::OutOfRange {
                                field: "status".into(),
                                value: s.to_string(),
                                range: "the HTTP status range 100 to 599",
                            };
                            self.error(n, kind);
                            return None;
                        }
                        u16::try_from(s).ok()?
                    }
                    None => 200,
                };
                let content_type = match get("content_type") {
                    Some(n) => self.name("content_type", n)?,
                    None => DEFAULT_FAKE_CONTENT_TYPE.to_owned(),
                };
                let body = match get("body") {
                    Some(n) if n.is_null() => String::new(),
                    Some(n) => self.string("body", n)?,
                    None => String::new(),
                };
                Action::Fake {
                    status,
                    content_type,
                    body,
                }
            }
            "delay" => Action::Delay {
                max_wait: match get("max_wait") {
                    Some(n) => Some(self.duration("max_wait", n)?),
                    None => None,
                },
            },
            _ => Action::Soft {
                header: match get("header") {
                    Some(n) => self.name("header", n)?,
                    None => DEFAULT_SOFT_HEADER.to_owned(),
                },
            },
        })
    }
}

/// The optional algorithm parameters of one limit.
#[derive(Default)]
struct Params<'n> {
    burst: Option<u64>,
    queue_size: Option<u64>,
    max_wait: Option<Duration>,
    first_request: Option<bool>,
    utc_offset: Option<(i32, &'n Node)>,
}

fn param_name(param: &str) -> &'static str {
    LIMIT_FIELDS
        .iter()
        .copied()
        .find(|f| *f == param)
        .unwrap_or("parameter")
}

fn param_applies(param: &str, algorithm: Algorithm) -> bool {
    match param {
        "burst" => matches!(algorithm, Algorithm::TokenBucket | Algorithm::Gcra),
        "queue_size" | "max_wait" => algorithm == Algorithm::LeakyQueue,
        _ => algorithm == Algorithm::FixedWindow,
    }
}

fn applies_to(param: &str) -> &'static str {
    match param {
        "burst" => "token_bucket and gcra",
        "queue_size" | "max_wait" => "leaky_queue",
        _ => "fixed_window",
    }
}

/// Maps one limit onto a core policy. `requests_per_unit` is the amount per window for every
/// algorithm; the rate-based ones default their burst or queue to that same amount, so switching
/// the algorithm alone keeps the long-run rate.
fn build_policy(
    algorithm: Algorithm,
    window: Duration,
    requests: u64,
    params: &Params<'_>,
) -> Result<Policy, PolicyError> {
    Ok(match algorithm {
        Algorithm::TokenBucket => Policy::from(TokenBucket::new(
            params.burst.unwrap_or(requests),
            Rate::new(requests, window)?,
        )?),
        Algorithm::Gcra => Policy::from(Gcra::new(
            Rate::new(requests, window)?,
            params.burst.unwrap_or(requests),
        )?),
        Algorithm::LeakyQueue => Policy::from(LeakyQueue::new(
            Rate::new(requests, window)?,
            params.queue_size.unwrap_or(requests),
            match params.max_wait {
                Some(w) if w.is_zero() => {
                    return Err(PolicyError::ZeroDuration {
                        what: "maximum wait",
                    });
                }
                Some(w) => w,
                None => window,
            },
        )?),
        Algorithm::FixedWindow => {
            let alignment = if params.first_request == Some(true) {
                Alignment::FirstRequest
            } else {
                Alignment::Clock {
                    utc_offset_secs: params.utc_offset.map_or(0, |(o, _)| o),
                }
            };
            Policy::from(FixedWindow::new(requests, window, alignment)?)
        }
        Algorithm::SlidingLog => Policy::from(SlidingLog::new(requests, window)?),
        Algorithm::SlidingCounter => Policy::from(SlidingCounter::new(requests, window)?),
    })
}

/// Envoy's value forms: empty is no value, a trailing `*` is a prefix wildcard.
fn value_match(value: &str) -> ValueMatch {
    if value.is_empty() {
        ValueMatch::Any
    } else if let Some(prefix) = value.strip_suffix('*') {
        ValueMatch::Prefix(prefix.to_owned())
    } else {
        ValueMatch::Exact(value.to_owned())
    }
}

/// `+03:00`, `-05:30`, `+0300`, `Z` or `UTC`, in seconds east of UTC.
fn parse_utc_offset(text: &str) -> Option<i64> {
    if matches!(text, "Z" | "z" | "UTC") {
        return Some(0);
    }
    if !text.is_ascii() {
        return None;
    }
    let (sign, rest) = match text.as_bytes().first()? {
        b'+' => (1, &text[1..]),
        b'-' => (-1, &text[1..]),
        _ => return None,
    };
    let (h, m) = match rest.split_once(':') {
        Some((h, m)) => (h, m),
        None if rest.len() == 4 => rest.split_at(2),
        None => (rest, "0"),
    };
    if h.is_empty() || h.len() > 2 || m.len() > 2 {
        return None;
    }
    let h: i64 = h.parse().ok()?;
    let m: i64 = m.parse().ok()?;
    (m < 60).then_some(sign * (h * 3600 + m * 60))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_offsets() {
        assert_eq!(parse_utc_offset("+03:00"), Some(10_800));
        assert_eq!(parse_utc_offset("-05:30"), Some(-19_800));
        assert_eq!(parse_utc_offset("+0530"), Some(19_800));
        assert_eq!(parse_utc_offset("+3"), Some(10_800));
        assert_eq!(parse_utc_offset("Z"), Some(0));
        assert_eq!(parse_utc_offset("03:00"), None);
        assert_eq!(parse_utc_offset("+03:75"), None);
        assert_eq!(parse_utc_offset("+"), None);
    }

    #[test]
    fn value_forms() {
        assert_eq!(value_match(""), ValueMatch::Any);
        assert_eq!(value_match("a*"), ValueMatch::Prefix("a".into()));
        assert_eq!(value_match("*"), ValueMatch::Prefix(String::new()));
        assert_eq!(value_match("a*b"), ValueMatch::Exact("a*b".into()));
    }
}
