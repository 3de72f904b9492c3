//! One limit: `unlimited`, or a window (Envoy's `unit` or any `window`), an amount per window,
//! a `name` and what it `replaces`, each read where it is written, or a limit on requests in
//! flight (`concurrency`, with its `ttl`); the algorithm's part is in `algorithm.rs`.

use std::sync::Arc;

use sluice_core::algorithm::DEFAULT_CONCURRENCY_TTL;
use sluice_core::{Algorithm, PolicyError};

use super::Decoder;
use super::algorithm::build_policy;
use super::outcome::Inherited;
use crate::error::{ErrorKind, Location};
use crate::model::{Action, LimitConfig, Unit};
use crate::suggest::closest;
use crate::yaml::{Node, NodeKind};

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
    "sub_windows",
    "action",
    "on_store_error",
    "concurrency",
    "ttl",
];

/// The fields a concurrency limit has no use for: it counts requests in flight, not per window.
const NOT_FOR_CONCURRENCY: [&str; 4] = ["requests_per_unit", "unit", "window", "algorithm"];
const REPLACES_FIELDS: &[&str] = &["name"];

/// What one limit entry turned out to be.
pub(super) enum LimitEntry {
    Unlimited(Location),
    Limit(LimitConfig),
}

impl Decoder {
    pub(super) fn limit(
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
                "sub_windows",
                "concurrency",
                "ttl",
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

        if let Some(n) = fields.get("concurrency") {
            return self.limit_in_flight(n, node, &fields, name, replaces, inherited, shadow_mode);
        }
        if let Some(n) = fields.get("ttl") {
            let kind = ErrorKind::ParamNotForAlgorithm {
                param: "ttl",
                algorithm: "a limit per window",
                applies_to: "concurrency limits".to_owned(),
            };
            self.error(n, kind);
        }

        let algorithm_node = fields.get("algorithm");
        let algorithm = match algorithm_node {
            None => Some(Algorithm::DEFAULT),
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

        let params = self.params(&fields, algorithm);

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
                    // Where the count is written, or the window it does not divide.
                    PolicyError::SubWindows { .. } | PolicyError::UnevenSubWindows { .. } => {
                        fields.get("sub_windows").unwrap_or(window_node)
                    }
                };
                self.error(at, ErrorKind::Policy(e));
                return None;
            }
        };
        let action = action.unwrap_or(if algorithm.spec().costs.delays {
            // A shaper's point is to delay, so a queue delays unless told otherwise.
            Action::Delay { max_wait: None }
        } else {
            Action::Reject
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

    /// A limit on requests in flight: `concurrency: N`, with `ttl` (how long a hold counts when
    /// its reservation is never settled, 5 minutes by default). Its algorithm is the table's
    /// concurrent one, so no field of a limit per window applies.
    #[allow(clippy::too_many_arguments)]
    fn limit_in_flight(
        &mut self,
        count: &Node,
        node: &Node,
        fields: &super::fields::Fields<'_>,
        name: Option<String>,
        replaces: Vec<Arc<str>>,
        inherited: &Inherited,
        shadow_mode: bool,
    ) -> Option<LimitEntry> {
        let mut ok = true;
        for field in NOT_FOR_CONCURRENCY
            .into_iter()
            .chain(sluice_core::algorithm::Param::ALL.map(|p| p.name()))
        {
            if let Some(n) = fields.get(field) {
                let kind = ErrorKind::Conflict {
                    first: "concurrency",
                    second: param_name(field),
                    hint: "a concurrency limit counts requests in flight, not per window; \
                           keep one or the other",
                };
                self.error(n, kind);
                ok = false;
            }
        }
        let limit = self.uint("concurrency", count);
        let ttl_node = fields.get("ttl");
        let ttl = match ttl_node {
            Some(n) => self.duration("ttl", n),
            None => Some(DEFAULT_CONCURRENCY_TTL),
        };
        let action = match fields.get("action") {
            Some(n) => self.action(n),
            None => None,
        }
        .or_else(|| inherited.action.clone())
        .unwrap_or(Action::Reject);
        let on_store_error = fields
            .get("on_store_error")
            .and_then(|n| self.on_store_error(n))
            .or(inherited.on_store_error)
            .unwrap_or_default();
        let (limit, ttl) = (limit?, ttl?);
        if !ok {
            return None;
        }
        let algorithm = Algorithm::ALL.into_iter().find(|a| a.spec().concurrent)?;
        let policy = match algorithm
            .spec()
            .build(&sluice_core::algorithm::PolicyParams::new(limit, ttl))
        {
            Ok(p) => p,
            Err(e) => {
                let at = match e {
                    PolicyError::ZeroDuration { .. } => ttl_node.unwrap_or(node),
                    _ => count,
                };
                self.error(at, ErrorKind::Policy(e));
                return None;
            }
        };
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
}

pub(super) fn param_name(param: &str) -> &'static str {
    LIMIT_FIELDS
        .iter()
        .copied()
        .find(|f| *f == param)
        .unwrap_or("parameter")
}
