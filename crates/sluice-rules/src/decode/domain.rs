//! The top level of a rule file and its tree of descriptors: the domain's name, the settings it
//! passes down, and each descriptor's key, value, flags, limits and children.

use std::collections::HashMap;
use std::sync::Arc;

use super::Decoder;
use super::limit::LimitEntry;
use super::outcome::Inherited;
use super::value_match::value_match;
use crate::error::{ConfigError, ErrorKind};
use crate::model::{DescriptorConfig, DomainConfig, LimitConfig, ValueMatch};
use crate::yaml::{Node, NodeKind};

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
    "value_to_metric",
    "quota_mode",
    "metadata",
    "action",
    "on_store_error",
];

impl Decoder {
    pub(super) fn domain(&mut self, root: &Node) -> Option<DomainConfig> {
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
                let kind = ErrorKind::DuplicateDescriptor {
                    what: d.what(),
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
        if let (true, Some(ValueMatch::Any | ValueMatch::Exact(_))) = (share_threshold, &value) {
            let shown = match &value {
                Some(ValueMatch::Exact(v)) => format!("`{v}`"),
                _ => "(none)".to_owned(),
            };
            let at = fields.get("share_threshold").unwrap_or(node);
            self.error(at, ErrorKind::ShareWithoutWildcard { value: shown });
        }
        let value_to_metric = flag(self, "value_to_metric");
        let quota_mode = flag(self, "quota_mode");
        let metadata = match fields.get("metadata") {
            Some(n) if !n.is_null() => self.metadata(n).map(Arc::new),
            _ => None,
        };
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
            value_to_metric,
            quota_mode,
            metadata,
            descriptors,
        })
    }
}
