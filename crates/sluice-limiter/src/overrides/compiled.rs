//! The overrides compiled against one rule set, for the hot path: per domain, the exact
//! descriptor to the rule it overrides and the rule that replaces it. Built again whenever the
//! overrides change or the rules are reloaded; a lookup is one hash of the domain and one of
//! the descriptor's entries.

use std::hash::Hasher;
use std::sync::Arc;
use std::time::SystemTime;

use siphasher::sip::SipHasher13;
use sluice_core::Policy;
use sluice_rules::{MatchedCheck, Rule, RuleSet, decode_limit};

use super::record::Record;
use crate::request::RequestDescriptor;

/// The tables hash descriptors set through the admin API on insert, and request descriptors
/// on lookup, which cannot grow a chain: a fast hasher is safe here, as in the matcher.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// What an override does once compiled against the rules in force.
#[derive(Debug)]
pub(crate) struct Applied {
    /// The rule of the rule set whose limit it replaces.
    pub(crate) target: Arc<Rule>,
    /// That rule under the override's limit.
    pub(crate) rule: Arc<Rule>,
    /// Appended to the rule's counter key when the override's algorithm keeps its state in
    /// another shape (see [`key_suffix`]); `None` keeps the rule's counter.
    pub(crate) key_suffix: Option<String>,
    /// When it stops applying.
    pub(crate) expires: Option<SystemTime>,
}

/// The overrides as they apply to one rule set.
#[derive(Debug, Default)]
pub(crate) struct Compiled {
    /// The rule set they were compiled against; held, so that its address names it.
    pub(crate) rules: Option<Arc<RuleSet>>,
    /// The generation of the overrides they were compiled from.
    pub(crate) generation: u64,
    /// Per domain, each overridden descriptor.
    pub(crate) domains: HashMap<String, HashMap<Vec<(String, String)>, Applied>>,
    /// The overrides that match no rule of this set, by id, with why.
    pub(crate) unmatched: HashMap<String, String>,
}

impl Compiled {
    /// Whether this was compiled against `rules`.
    pub(crate) fn is_for(&self, rules: &Arc<RuleSet>, generation: u64) -> bool {
        self.generation == generation && self.rules.as_ref().is_some_and(|r| Arc::ptr_eq(r, rules))
    }

    /// The override of `entries` in `domain`, if it applies.
    pub(crate) fn applied(&self, domain: &str, entries: &[(String, String)]) -> Option<&Applied> {
        self.domains.get(domain)?.get(entries)
    }

    /// Puts the overrides in force on `checks`, the rules' checks of `descriptors`: a check
    /// whose descriptor is overridden and whose rule is the overridden one gets the override's
    /// rule, on the same counter unless the shapes differ.
    pub(crate) fn apply(
        &self,
        domain: &str,
        descriptors: &[RequestDescriptor],
        checks: &mut [MatchedCheck],
    ) {
        let Some(table) = self.domains.get(domain) else {
            return;
        };
        let mut now = None;
        for check in checks {
            let Some(applied) = table.get(&descriptors[check.descriptor].entries) else {
                continue;
            };
            if !Arc::ptr_eq(&applied.target, &check.rule) {
                continue;
            }
            if let Some(expires) = applied.expires {
                if *now.get_or_insert_with(SystemTime::now) >= expires {
                    continue;
                }
            }
            check.rule = Arc::clone(&applied.rule);
            if let Some(suffix) = &applied.key_suffix {
                check.key.push_str(suffix);
            }
        }
    }
}

/// Compiles `records` (id to record) against `rules`, leaving out those expired by now.
pub(crate) fn compile<'a>(
    rules: &Arc<RuleSet>,
    generation: u64,
    records: impl Iterator<Item = (&'a String, &'a Record)>,
) -> Compiled {
    let mut compiled = Compiled {
        rules: Some(Arc::clone(rules)),
        generation,
        ..Compiled::default()
    };
    let now = SystemTime::now();
    for (id, record) in records {
        // An expired override applies to nothing; the table leaves it out.
        if record.expiry().is_some_and(|e| e <= now) {
            continue;
        }
        match resolve(rules, record) {
            Ok(applied) => {
                compiled
                    .domains
                    .entry(record.domain.clone())
                    .or_default()
                    .insert(record.entries(), applied);
            }
            Err(reason) => {
                compiled.unmatched.insert(id.clone(), reason);
            }
        }
    }
    compiled
}

/// What `record` does under `rules`, or why it matches nothing there: its domain is gone, its
/// descriptor ends at no limit, it names no limit of several, or its limit does not decode.
pub(crate) fn resolve(rules: &RuleSet, record: &Record) -> Result<Applied, String> {
    let domain = &record.domain;
    if rules.domain(domain).is_none() {
        let known = rules.domain_names().join(", ");
        return Err(format!(
            "unknown domain `{domain}`; the rules define: {}",
            if known.is_empty() { "none" } else { &known }
        ));
    }
    let entries = record.entries();
    let matches = rules.checks(domain, std::slice::from_ref(&entries), 1);
    if !matches.unlimited.is_empty() {
        return Err(format!(
            "the descriptor matches an `unlimited` rule of domain `{domain}`: it has no limit to \
             override"
        ));
    }
    if matches.checks.is_empty() {
        return Err(format!(
            "the descriptor matches no rule of domain `{domain}`: an override replaces the limit \
             of the rule whose descriptor ends exactly where it does; see GET /v1/rules"
        ));
    }
    let name = record
        .rate_limit
        .get("name")
        .and_then(serde_json::Value::as_str);
    let target = match name {
        Some(name) => matches
            .checks
            .iter()
            .find(|c| c.rule.name.as_deref() == Some(name))
            .ok_or_else(|| {
                format!(
                    "the descriptor's rule has no limit named `{name}`; its limits: {}",
                    limit_names(&matches.checks)
                )
            })?,
        None if matches.checks.len() == 1 => &matches.checks[0],
        None => {
            return Err(format!(
                "the descriptor matches {} limits ({}); set `name` in `rate_limit` to the one \
                 to override",
                matches.checks.len(),
                limit_names(&matches.checks)
            ));
        }
    };
    let text = serde_json::to_string(&record.rate_limit).unwrap_or_default();
    let source: Arc<str> = Arc::from("rate_limit");
    let inherit = (
        Some(target.rule.action.clone()),
        Some(target.rule.on_store_error),
    );
    let limit = decode_limit(&source, &text, inherit).map_err(|e| {
        e.errors()
            .iter()
            .map(|e| format!("rate_limit: {}", e.kind))
            .collect::<Vec<_>>()
            .join("; ")
    })?;
    let key_suffix = key_suffix(&target.rule.policy, &limit.policy);
    Ok(Applied {
        target: Arc::clone(&target.rule),
        rule: Arc::new(target.rule.overridden_by(limit)),
        key_suffix,
        expires: record.expiry(),
    })
}

/// The limits of `checks` by name, for a message.
fn limit_names(checks: &[MatchedCheck]) -> String {
    checks
        .iter()
        .map(|c| format!("`{}`", c.rule.label()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The parameters that size a limit rather than shape its state: an override may change these
/// and keep the rule's counter.
const SIZE_FIELDS: &[&str] = &["limit", "capacity", "burst", "queue", "max_wait", "rate"];

/// What a counter's state means under `policy`: its algorithm and the parameters other than
/// its size (a window's length and alignment, a bucketed window's buckets). Two policies of one
/// shape read each other's state: a window's count is a count whatever the limit, a bucket's
/// level and a meter's time are clamped by the decision to the new capacity.
fn shape(policy: &Policy) -> String {
    let id = policy.key_id();
    id.split(';')
        .filter(|part| {
            part.split_once('=')
                .is_none_or(|(field, _)| !SIZE_FIELDS.contains(&field))
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// `None` when an override of `rule`'s limit by `limit` keeps the rule's counter (one shape);
/// otherwise a suffix naming a counter of the override's own (`~` and 16 hex digits of its
/// policy), so that neither reads the other's state in a shape it was not written in. The
/// suffix follows the hash tag, so the counter stays in the rule's Cluster slot.
pub(crate) fn key_suffix(rule: &Policy, limit: &Policy) -> Option<String> {
    if shape(rule) == shape(limit) {
        return None;
    }
    let mut h = SipHasher13::new_with_keys(0x6f76_6572_7269_6465, 0x7368_6170_6500_0001);
    h.write(limit.key_id().as_bytes());
    Some(format!("~{:016x}", h.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(rules: &str) -> Policy {
        let set = RuleSet::parse(
            "r.yaml",
            &format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {rules}\n"),
        )
        .unwrap();
        let rule = set.rules().next().unwrap();
        (*rule.policy).clone()
    }

    #[test]
    fn a_limit_of_the_same_shape_keeps_the_counter() {
        let window = policy("{unit: minute, requests_per_unit: 10}");
        let raised = policy("{unit: minute, requests_per_unit: 5000}");
        assert_eq!(key_suffix(&window, &raised), None);
        let bucket = policy("{algorithm: token_bucket, unit: minute, requests_per_unit: 10}");
        let bigger =
            policy("{algorithm: token_bucket, unit: second, requests_per_unit: 100, burst: 500}");
        assert_eq!(key_suffix(&bucket, &bigger), None);
    }

    #[test]
    fn another_window_or_algorithm_counts_apart() {
        let minute = policy("{unit: minute, requests_per_unit: 10}");
        let hour = policy("{unit: hour, requests_per_unit: 10}");
        let gcra = policy("{algorithm: gcra, unit: minute, requests_per_unit: 10}");
        assert!(key_suffix(&minute, &hour).is_some());
        assert!(key_suffix(&minute, &gcra).is_some());
        assert_ne!(key_suffix(&minute, &hour), key_suffix(&minute, &gcra));
    }
}
