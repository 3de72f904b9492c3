//! The one decision path every front end ends in: descriptors → rules → checks → store →
//! verdict, with fallback on store errors and metrics.

use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use siphasher::sip128::{Hasher128, SipHasher13};
use sluice_core::{
    Alignment, Check, Decision, DynStore, FixedWindow, MemoryStore, OnStoreError, Policy,
    decide_without_store,
};
use sluice_rules::{Action, DescriptorEntries, Reloader, Rule, RuleSet, Unit};

use crate::limits::{MAX_COST, MAX_DESCRIPTORS, MAX_ENTRIES, MAX_FIELD_LEN};
use crate::metrics::{Metrics, Outcome};

/// One descriptor of a request, as every front end parses it.
#[derive(Debug, Clone, Default)]
pub struct RequestDescriptor {
    /// Ordered key/value entries.
    pub entries: Vec<(String, String)>,
    /// The descriptor's own cost (Envoy's per-descriptor `hits_addend`); a present 0 checks
    /// without consuming.
    pub cost: Option<u64>,
    /// A limit sent with the request, replacing whatever the rules say for this descriptor
    /// (Envoy's `RateLimitOverride`).
    pub limit_override: Option<LimitOverride>,
}

/// A per-request limit (Envoy's `RateLimitOverride`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Requests per unit.
    pub requests_per_unit: u64,
    /// The unit.
    pub unit: Unit,
}

impl DescriptorEntries for RequestDescriptor {
    fn entry_count(&self) -> usize {
        self.entries.len()
    }
    fn entry(&self, i: usize) -> (&str, &str) {
        (&self.entries[i].0, &self.entries[i].1)
    }
    fn cost(&self) -> Option<u64> {
        self.cost
    }
}

/// A request to decide.
#[derive(Debug, Clone, Default)]
pub struct LimitRequest {
    /// The rules domain.
    pub domain: String,
    /// The descriptors, each checked against the domain's rules.
    pub descriptors: Vec<RequestDescriptor>,
    /// The cost of each descriptor that has none of its own.
    pub cost: u64,
}

/// Why a request cannot be decided. Every message names the field and the bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    /// No domain.
    #[error("`domain` is missing or empty; name the rules domain to check against")]
    MissingDomain,
    /// No descriptors.
    #[error("`descriptors` is missing or empty; send at least one descriptor")]
    NoDescriptors,
    /// A descriptor without entries.
    #[error("`descriptors[{0}].entries` is empty; a descriptor needs at least one entry")]
    EmptyDescriptor(usize),
    /// An entry without a key.
    #[error("`descriptors[{0}].entries[{1}].key` is empty")]
    EmptyKey(usize, usize),
    /// Something too large.
    #[error("`{field}` has {got}, more than the limit of {max}")]
    TooLarge {
        /// The field.
        field: String,
        /// What was sent.
        got: usize,
        /// The bound.
        max: usize,
    },
    /// A cost out of range.
    #[error("`{field}` is {got}, above the largest cost of {max}")]
    CostTooLarge {
        /// The field.
        field: String,
        /// What was sent.
        got: u64,
        /// The bound.
        max: u64,
    },
}

impl LimitRequest {
    /// Checks the request against the bounds in [`crate::limits`].
    pub fn validate(&self) -> Result<(), InvalidRequest> {
        if self.domain.is_empty() {
            return Err(InvalidRequest::MissingDomain);
        }
        within(&self.domain, || "domain".into())?;
        if self.descriptors.is_empty() {
            return Err(InvalidRequest::NoDescriptors);
        }
        at_most(self.descriptors.len(), MAX_DESCRIPTORS, || {
            "descriptors".into()
        })?;
        if self.cost > MAX_COST {
            return Err(InvalidRequest::CostTooLarge {
                field: "hits_addend".into(),
                got: self.cost,
                max: MAX_COST,
            });
        }
        for (i, d) in self.descriptors.iter().enumerate() {
            if d.entries.is_empty() {
                return Err(InvalidRequest::EmptyDescriptor(i));
            }
            at_most(d.entries.len(), MAX_ENTRIES, || {
                format!("descriptors[{i}].entries")
            })?;
            if let Some(cost) = d.cost.filter(|c| *c > MAX_COST) {
                return Err(InvalidRequest::CostTooLarge {
                    field: format!("descriptors[{i}].hits_addend"),
                    got: cost,
                    max: MAX_COST,
                });
            }
            for (j, (k, v)) in d.entries.iter().enumerate() {
                if k.is_empty() {
                    return Err(InvalidRequest::EmptyKey(i, j));
                }
                within(k, || format!("descriptors[{i}].entries[{j}].key"))?;
                within(v, || format!("descriptors[{i}].entries[{j}].value"))?;
            }
        }
        Ok(())
    }
}

/// `got` against `max`. The field is named only when it is too large: every request is
/// validated, and naming each field on the way costs more than the check.
fn at_most(got: usize, max: usize, field: impl FnOnce() -> String) -> Result<(), InvalidRequest> {
    if got > max {
        return Err(InvalidRequest::TooLarge {
            field: field(),
            got,
            max,
        });
    }
    Ok(())
}

/// A text field's length in characters against [`MAX_FIELD_LEN`].
fn within(text: &str, field: impl FnOnce() -> String) -> Result<(), InvalidRequest> {
    // No more characters than bytes: a short text needs no counting.
    if text.len() <= MAX_FIELD_LEN {
        return Ok(());
    }
    at_most(text.chars().count(), MAX_FIELD_LEN, field)
}

/// How one limit of a request was decided.
#[derive(Debug, Clone)]
pub struct CheckResult {
    /// Which descriptor it belongs to.
    pub descriptor: usize,
    /// The counter key.
    pub key: String,
    /// The name for headers and metrics: the rule's `name`, else its path.
    pub name: Arc<str>,
    /// The policy.
    pub policy: Arc<Policy>,
    /// The rule, absent for a per-request override.
    pub rule: Option<Arc<Rule>>,
    /// The store's answer (or the fallback's).
    pub decision: Decision,
    /// What it counts as.
    pub outcome: Outcome,
}

impl CheckResult {
    /// Whether a denial on this limit refuses the request (not shadow or soft).
    pub fn enforced(&self) -> bool {
        self.rule.as_ref().is_none_or(|r| enforces(r))
    }
}

fn enforces(rule: &Rule) -> bool {
    !rule.shadow && !matches!(rule.action, Action::Shadow | Action::Soft { .. })
}

/// The answer to a whole request.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// Whether the request may go ahead.
    pub allowed: bool,
    /// Every limit that applied, in descriptor order.
    pub checks: Vec<CheckResult>,
    /// Indexes of descriptors that matched an `unlimited` rule.
    pub unlimited: Vec<usize>,
}

impl Verdict {
    /// The limits that applied to descriptor `i`.
    pub fn for_descriptor(&self, i: usize) -> impl Iterator<Item = &CheckResult> {
        self.checks.iter().filter(move |c| c.descriptor == i)
    }

    /// The enforced limit that restricts descriptor `i` most, if any applied.
    pub fn tightest(&self, i: usize) -> Option<&CheckResult> {
        self.for_descriptor(i).reduce(|a, b| {
            let key = |c: &CheckResult| (c.enforced() && !c.decision.allowed, !c.decision.allowed);
            match key(b).cmp(&key(a)) {
                std::cmp::Ordering::Greater => b,
                std::cmp::Ordering::Less => a,
                std::cmp::Ordering::Equal if b.decision.remaining < a.decision.remaining => b,
                std::cmp::Ordering::Equal => a,
            }
        })
    }
}

/// The limiter: rules, a store, a local fallback store and metrics.
pub struct Limiter {
    rules: Arc<Reloader>,
    store: Arc<dyn DynStore>,
    local: MemoryStore,
    metrics: Arc<Metrics>,
    /// Each rule's decision counters, so that counting a decision neither copies nor hashes
    /// its labels.
    counters: RwLock<Option<RuleCounters>>,
    /// The `Retry-After` given by `on_store_error: deny`.
    deny_retry: Duration,
}

/// The decision counters of the rules of one rule set, by the rule's address and the outcome.
/// A reload starts afresh; holding the set meanwhile keeps every rule in it alive, so no
/// address can be reused by another rule.
struct RuleCounters {
    rules: Arc<RuleSet>,
    by_rule: HashMap<usize, [Option<Counter>; 4]>,
}

impl RuleCounters {
    fn get(&self, rules: &Arc<RuleSet>, rule: &Arc<Rule>, outcome: Outcome) -> Option<&Counter> {
        if !Arc::ptr_eq(&self.rules, rules) {
            return None;
        }
        self.by_rule.get(&address(rule))?[outcome_index(outcome)].as_ref()
    }
}

fn address(rule: &Arc<Rule>) -> usize {
    Arc::as_ptr(rule) as usize
}

fn outcome_index(outcome: Outcome) -> usize {
    match outcome {
        Outcome::Allowed => 0,
        Outcome::Limited => 1,
        Outcome::ShadowLimited => 2,
        Outcome::StoreError => 3,
    }
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter").finish_non_exhaustive()
    }
}

/// A check ready for the store.
struct Planned {
    descriptor: usize,
    key: String,
    cost: u64,
    policy: Arc<Policy>,
    rule: Option<Arc<Rule>>,
}

impl Limiter {
    /// A limiter over `rules` and `store`.
    pub fn new(rules: Arc<Reloader>, store: Arc<dyn DynStore>, metrics: Arc<Metrics>) -> Self {
        Limiter {
            rules,
            store,
            local: MemoryStore::new(),
            metrics,
            counters: RwLock::new(None),
            deny_retry: Duration::from_secs(1),
        }
    }

    /// The rules in force.
    pub fn reloader(&self) -> &Arc<Reloader> {
        &self.rules
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn DynStore> {
        &self.store
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Decides a request. Invalid requests are refused before anything is counted.
    pub async fn decide(&self, request: &LimitRequest) -> Result<Verdict, InvalidRequest> {
        request.validate()?;
        let started = Instant::now();
        let rules = self.rules.rules();
        let cost = request.cost.max(1);
        let matches = rules.checks(&request.domain, &request.descriptors, cost);
        let mut planned: Vec<Planned> = Vec::with_capacity(matches.checks.len());
        for (i, d) in request.descriptors.iter().enumerate() {
            if let Some(o) = d.limit_override {
                planned.extend(override_check(&request.domain, i, d, o, cost));
            }
        }
        for m in matches.checks {
            if request.descriptors[m.descriptor].limit_override.is_some() {
                continue;
            }
            planned.push(Planned {
                descriptor: m.descriptor,
                policy: m.rule.policy.clone(),
                key: m.key,
                cost: m.cost,
                rule: Some(m.rule),
            });
        }
        planned.sort_by_key(|p| p.descriptor);

        // Enforced limits are all-or-nothing together; shadow and soft limits count on their
        // own, so that one of them refusing never stops a passing request from being counted.
        let (enforced, observed): (Vec<usize>, Vec<usize>) =
            (0..planned.len()).partition(|&i| planned[i].rule.as_ref().is_none_or(|r| enforces(r)));
        let (a, b) = if observed.is_empty() {
            (
                self.check_group(&planned, &enforced).await,
                (Vec::new(), false),
            )
        } else {
            tokio::join!(
                self.check_group(&planned, &enforced),
                self.check_group(&planned, &observed)
            )
        };
        // Each planned check's decision, and whether it came from the fallback. With no shadow
        // or soft limit (the usual case), the enforced group is every check, in order.
        let results: Vec<Option<(Decision, bool)>> = if observed.is_empty() {
            a.0.into_iter().map(|d| Some((d, a.1))).collect()
        } else {
            let mut results = vec![None; planned.len()];
            for (i, d) in enforced.iter().zip(a.0) {
                results[*i] = Some((d, a.1));
            }
            for (i, d) in observed.iter().zip(b.0) {
                results[*i] = Some((d, b.1));
            }
            results
        };
        let mut verdict = Verdict {
            allowed: true,
            checks: Vec::with_capacity(planned.len()),
            unlimited: matches.unlimited,
        };
        for (p, r) in planned.into_iter().zip(results) {
            let Some((decision, store_failed)) = r else {
                continue;
            };
            let enforced = p.rule.as_ref().is_none_or(|r| enforces(r));
            let outcome = match (decision.allowed, enforced, store_failed) {
                (_, _, true) => Outcome::StoreError,
                (true, _, _) => Outcome::Allowed,
                (false, true, _) => Outcome::Limited,
                (false, false, _) => Outcome::ShadowLimited,
            };
            if enforced && !decision.allowed {
                verdict.allowed = false;
            }
            let name: Arc<str> = match &p.rule {
                Some(r) => r.name.clone().unwrap_or_else(|| r.path.clone()),
                None => Arc::from("override"),
            };
            match &p.rule {
                Some(rule) => self.count(&rules, rule, &request.domain, &name, outcome),
                None => self.metrics.decision(&request.domain, &name, outcome),
            }
            if outcome == Outcome::Limited {
                self.metrics.limited_key(&p.key);
            }
            verdict.checks.push(CheckResult {
                descriptor: p.descriptor,
                key: p.key,
                name,
                policy: p.policy,
                rule: p.rule,
                decision,
                outcome,
            });
        }
        self.metrics.observe_latency(started.elapsed());
        Ok(verdict)
    }

    /// Counts a decision of `rule`, from `rules`, on its cached counter.
    fn count(
        &self,
        rules: &Arc<RuleSet>,
        rule: &Arc<Rule>,
        domain: &str,
        name: &str,
        outcome: Outcome,
    ) {
        {
            let cache = self.counters.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(counter) = cache.as_ref().and_then(|c| c.get(rules, rule, outcome)) {
                counter.inc();
                return;
            }
        }
        let counter = self.metrics.decision_counter(domain, name, outcome);
        counter.inc();
        let mut cache = self
            .counters
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let current = cache.as_ref().is_some_and(|c| Arc::ptr_eq(&c.rules, rules));
        if !current {
            *cache = Some(RuleCounters {
                rules: Arc::clone(rules),
                by_rule: HashMap::new(),
            });
        }
        if let Some(cache) = cache.as_mut() {
            cache.by_rule.entry(address(rule)).or_default()[outcome_index(outcome)] = Some(counter);
        }
    }

    /// Checks the planned checks at `which` atomically; returns their decisions, and whether
    /// they came from the fallback because the store failed.
    async fn check_group(&self, planned: &[Planned], which: &[usize]) -> (Vec<Decision>, bool) {
        if which.is_empty() {
            return (Vec::new(), false);
        }
        let checks: Vec<Check<'_>> = which
            .iter()
            .map(|&i| Check::new(&planned[i].key, &planned[i].policy, planned[i].cost))
            .collect();
        match self.store.check(&checks).await {
            Ok(decisions) => (decisions, false),
            Err(e) => {
                let before = self.metrics.store_error();
                // The first errors of an outage, then every power of two: enough to see it
                // start and last, without a log line per request while the store is down.
                if before < 8 || before.is_power_of_two() {
                    tracing::warn!(error = %e, transient = e.is_transient(), errors_so_far = before + 1, "store failed; applying on_store_error");
                }
                let modes: Vec<OnStoreError> = which
                    .iter()
                    .map(|&i| {
                        planned[i]
                            .rule
                            .as_ref()
                            .map_or(OnStoreError::Allow, |r| r.on_store_error)
                    })
                    .collect();
                let decisions =
                    decide_without_store(&checks, &modes, &self.local, self.deny_retry).await;
                (decisions, true)
            }
        }
    }
}

/// A check for a per-request limit override: a fixed window aligned on the epoch, as Envoy's,
/// on a counter of its own that no configured rule shares.
fn override_check(
    domain: &str,
    descriptor: usize,
    d: &RequestDescriptor,
    o: LimitOverride,
    cost: u64,
) -> Option<Planned> {
    let policy = FixedWindow::new(
        o.requests_per_unit,
        o.unit.duration(),
        Alignment::Clock { utc_offset_secs: 0 },
    )
    .ok()?;
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
    Some(Planned {
        descriptor,
        key,
        cost: d.cost.unwrap_or(cost),
        policy: Arc::new(Policy::from(policy)),
        rule: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(name: &str) -> String {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{name: {name}, unit: minute, requests_per_unit: 100}}\n"
        )
    }

    fn request() -> LimitRequest {
        LimitRequest {
            domain: "d".into(),
            descriptors: vec![RequestDescriptor {
                entries: vec![("k".into(), "v".into())],
                ..Default::default()
            }],
            cost: 1,
        }
    }

    #[tokio::test]
    async fn decisions_are_counted_on_the_rules_in_force_across_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, rules("first")).unwrap();
        let reloader = Reloader::new(vec![path.clone()]).unwrap();
        let limiter = Limiter::new(
            reloader.clone(),
            Arc::new(MemoryStore::new()),
            Arc::new(Metrics::new()),
        );
        let count = |name| limiter.metrics().decisions_of("d", name, Outcome::Allowed);
        for _ in 0..3 {
            assert!(limiter.decide(&request()).await.unwrap().allowed);
        }
        assert_eq!(count("first"), 3);

        std::fs::write(&path, rules("second")).unwrap();
        reloader.reload_now();
        limiter.decide(&request()).await.unwrap();
        assert_eq!((count("first"), count("second")), (3, 1));

        // Reloaded unchanged, the rule is a new object with the same labels: the same series.
        reloader.reload_now();
        limiter.decide(&request()).await.unwrap();
        assert_eq!((count("first"), count("second")), (3, 2));
    }

    #[test]
    fn an_invalid_request_names_the_field_and_the_bound() {
        let mut r = request();
        r.descriptors[0].entries[0].1 = "é".repeat(MAX_FIELD_LEN + 1);
        let e = r.validate().unwrap_err();
        assert_eq!(
            e,
            InvalidRequest::TooLarge {
                field: "descriptors[0].entries[0].value".into(),
                got: MAX_FIELD_LEN + 1,
                max: MAX_FIELD_LEN,
            }
        );
        // Longer in bytes than the bound, but not in characters: valid.
        r.descriptors[0].entries[0].1 = "é".repeat(MAX_FIELD_LEN / 2 + 1);
        assert!(r.validate().is_ok());
        r.descriptors[0].entries = vec![("k".into(), "v".into()); MAX_ENTRIES + 1];
        assert!(
            r.validate()
                .unwrap_err()
                .to_string()
                .contains("descriptors[0].entries")
        );
    }
}
