//! The first step of a decision: the checks a request makes. The rules in force match its
//! descriptors ([`RuleSet::checks`]); a descriptor that carries its own limit (Envoy's
//! per-request `limit` override) is checked against a rule made for the request instead, so
//! that every later step handles one type of limit, the [`Rule`].

use std::hash::Hasher;
use std::sync::{Arc, LazyLock};

use siphasher::sip128::{Hasher128, SipHasher13};
use sluice_core::Policy;
use sluice_rules::{
    Action, LimitConfig, Location, MatchedCheck, Matches, OnStoreError, Rule, RuleSet,
};

use crate::overrides::Overrides;
use crate::request::{LimitOverride, LimitRequest, RequestDescriptor};

/// The checks one request makes, before the store is asked.
pub(super) struct Plan {
    /// Each check's descriptor, counter key, cost and rule, in descriptor order.
    pub(super) checks: Vec<MatchedCheck>,
    /// The descriptors that matched an `unlimited` rule.
    pub(super) unlimited: Vec<usize>,
    /// envoyproxy/ratelimit's service-wide `QUOTA_MODE` as it was when the request came:
    /// every limit is a quota limit.
    pub(super) quota_mode: bool,
}

impl Plan {
    /// The plan of `request` under `rules` and the runtime `overrides`. Precedence: a
    /// descriptor's own Envoy `limit` override, then a runtime override, then the rules.
    pub(super) fn new(
        rules: &Arc<RuleSet>,
        request: &LimitRequest,
        quota_mode: bool,
        overrides: &Overrides,
    ) -> Plan {
        let cost = request.cost.max(1);
        let Matches {
            mut checks,
            unlimited,
        } = rules.checks(&request.domain, &request.descriptors, cost);
        overrides.apply(rules, &request.domain, &request.descriptors, &mut checks);
        if request
            .descriptors
            .iter()
            .any(|d| d.limit_override.is_some())
        {
            checks.retain(|c| request.descriptors[c.descriptor].limit_override.is_none());
            // An override replaces the rules of a domain the rules define, as
            // envoyproxy/ratelimit applies it; for a domain they do not, nothing is limited.
            if rules.domain(&request.domain).is_some() {
                for (i, d) in request.descriptors.iter().enumerate() {
                    if let Some(o) = d.limit_override {
                        checks.extend(override_check(&request.domain, i, d, o, cost));
                    }
                }
                checks.sort_by_key(|c| c.descriptor);
            }
        }
        Plan {
            checks,
            unlimited,
            quota_mode,
        }
    }

    /// Whether `check` is a quota limit (Envoy's `quota_mode`): its rule says so, or the
    /// service does.
    pub(super) fn quota(&self, check: &MatchedCheck) -> bool {
        self.quota_mode || check.rule.quota
    }
}

/// The label of every per-request override, and its location: one string for the process, so
/// a rule made for a request allocates nothing for them.
static OVERRIDE: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("override"));

/// A check for a per-request limit override: a fixed window aligned on the epoch, as Envoy's,
/// on a counter of its own that no configured rule shares. Its rule, made for the request, is
/// enforced, labelled `override` and lets the request pass when the store fails.
fn override_check(
    domain: &str,
    descriptor: usize,
    d: &RequestDescriptor,
    o: LimitOverride,
    cost: u64,
) -> Option<MatchedCheck> {
    let policy = Policy::envoy_limit(o.requests_per_unit, o.unit.duration()).ok()?;
    let mut h = SipHasher13::new_with_keys(0x6f76_6572_7269_6465, 0x736c_7569_6365_0001);
    for part in
        std::iter::once(domain).chain(d.entries.iter().flat_map(|(k, v)| [k.as_str(), v.as_str()]))
    {
        h.write_usize(part.len());
        h.write(part.as_bytes());
    }
    let key = format!(
        "{{override|{:032x}}}:{}/{}",
        h.finish128().as_u128(),
        o.requests_per_unit,
        o.unit.name()
    );
    let limit = LimitConfig {
        name: None,
        policy: Arc::new(policy),
        replaces: Vec::new(),
        action: Action::Reject,
        shadow: false,
        on_store_error: OnStoreError::Allow,
        location: Location::start_of(Arc::clone(&OVERRIDE)),
    };
    Some(MatchedCheck {
        descriptor,
        key,
        cost: d.cost.unwrap_or(cost),
        rule: Arc::new(Rule::standalone(limit, Arc::clone(&OVERRIDE))),
    })
}
