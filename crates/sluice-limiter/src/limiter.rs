//! The one decision path every front end ends in: descriptors → rules → checks → store →
//! verdict, with fallback on store errors and metrics.

use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use siphasher::sip128::{Hasher128, SipHasher13};
use sluice_core::{
    Alignment, Check, Decision, DynStore, FixedWindow, MemoryStore, OnStoreError, Policy,
    decide_without_store,
};
use sluice_rules::{Mode, Reloader, Rule, RuleSet};

use crate::activity::{DecisionHistory, ReloadLog};
use crate::metrics::{Metrics, Outcome, Snapshot};
use crate::open_store::OpenStore;
use crate::request::{InvalidRequest, LimitOverride, LimitRequest, RequestDescriptor};
use crate::store_telemetry::StoreTelemetry;
use crate::verdict::{LimitResult, Verdict};

/// The limiter: rules, a store, a local fallback store and metrics.
pub struct Limiter {
    rules: Arc<Reloader>,
    store: Arc<dyn DynStore>,
    /// The store's breaker and its own series, whichever store it is.
    telemetry: Arc<dyn StoreTelemetry>,
    local: MemoryStore,
    metrics: Arc<Metrics>,
    /// Each rule's decision counters, so that counting a decision neither copies nor hashes
    /// its labels.
    counters: RwLock<Option<RuleCounters>>,
    /// The `Retry-After` given by `on_store_error: deny`.
    deny_retry: Duration,
    /// Decision totals over the last minutes, for the dashboard.
    history: DecisionHistory,
    /// The last rule reloads, for the dashboard.
    reloads: Arc<ReloadLog>,
    /// envoyproxy/ratelimit's service-wide `QUOTA_MODE`: every limit is a quota limit.
    quota_mode: AtomicBool,
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
#[derive(Clone)]
struct Planned {
    descriptor: usize,
    key: String,
    cost: u64,
    policy: Arc<Policy>,
    rule: Option<Arc<Rule>>,
    mode: Mode,
    /// Envoy's `quota_mode`, from the rule or the service-wide setting.
    quota: bool,
}

impl Limiter {
    /// A limiter over `rules` and `store`.
    pub fn new(rules: Arc<Reloader>, store: Arc<dyn DynStore>, metrics: Arc<Metrics>) -> Self {
        Self::with_open_store(rules, OpenStore::plain(store), metrics)
    }

    /// A limiter over `rules` and an open store (one opened from its URL by `sluice-stores`),
    /// whose health (a Redis store's breaker and refunds, say) it reports in its metrics and
    /// readiness.
    pub fn with_open_store(rules: Arc<Reloader>, opened: OpenStore, metrics: Arc<Metrics>) -> Self {
        metrics.register_store(opened.telemetry.as_ref());
        let reloads = ReloadLog::follow(&rules);
        Limiter {
            rules,
            store: opened.store,
            telemetry: opened.telemetry,
            local: MemoryStore::new(),
            metrics,
            counters: RwLock::new(None),
            deny_retry: Duration::from_secs(1),
            history: DecisionHistory::default(),
            reloads,
            quota_mode: AtomicBool::new(false),
        }
    }

    /// Makes every limit a quota limit (envoyproxy/ratelimit's `QUOTA_MODE`): a request is
    /// refused only when every descriptor with a limit refuses it.
    pub fn set_quota_mode(&self, on: bool) {
        self.quota_mode.store(on, Ordering::Relaxed);
    }

    /// Decision totals over the last minutes, as [`crate::activity::sample_every`] samples them.
    pub fn history(&self) -> &DecisionHistory {
        &self.history
    }

    /// The last rule reloads, with their errors.
    pub fn reload_log(&self) -> &ReloadLog {
        &self.reloads
    }

    /// The store's circuit breaker, when it has one (Redis and hybrid stores do).
    pub fn breaker(&self) -> Option<sluice_core::BreakerState> {
        self.telemetry.breaker()
    }

    /// The metrics in Prometheus text form, every gauge refreshed from the rules, the store and
    /// the reloader.
    pub fn render_metrics(&self) -> String {
        let stats = self.rules.stats();
        self.telemetry.refresh();
        self.metrics.render(&Snapshot {
            tracked_keys: self.store.tracked_keys(),
            reloads: stats.reloads.load(Ordering::Relaxed),
            reload_failures: stats.failures.load(Ordering::Relaxed),
        })
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

    /// Resets the counter `key`, with the usage Envoy-counted reports put past its limit (see
    /// [`RequestDescriptor::envoy_hits`]). Whether there was anything to reset.
    pub async fn reset_counter(&self, key: &str) -> Result<bool, sluice_core::StoreError> {
        let counted = self.store.reset(key).await?;
        let beyond = self.store.reset(&over_key(key)).await?;
        Ok(counted || beyond)
    }

    /// Decides a request. Invalid requests are refused before anything is counted.
    pub async fn decide(&self, request: &LimitRequest) -> Result<Verdict, InvalidRequest> {
        request.validate()?;
        let started = Instant::now();
        let rules = self.rules.rules();
        let cost = request.cost.max(1);
        let matches = rules.checks(&request.domain, &request.descriptors, cost);
        let mut planned: Vec<Planned> = Vec::with_capacity(matches.checks.len());
        // An override replaces the rules of a domain the rules define, as envoyproxy/ratelimit
        // applies it; for a domain they do not, nothing is limited.
        let known_domain = rules.domain(&request.domain).is_some();
        for (i, d) in request.descriptors.iter().enumerate() {
            if let (Some(o), true) = (d.limit_override, known_domain) {
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
                mode: m.rule.mode,
                quota: m.rule.quota,
                rule: Some(m.rule),
            });
        }
        planned.sort_by_key(|p| p.descriptor);
        let global_quota = self.quota_mode.load(Ordering::Relaxed);
        if global_quota {
            for p in &mut planned {
                p.quota = true;
            }
        }

        // The usual request: one enforced limit, not counted Envoy's way. Its check goes to the
        // store on its own ([`Limiter::check_one`]), without the groups and vectors below; with
        // one check, quota mode has nothing to drop and retry.
        if planned.len() == 1
            && planned[0].mode.enforces()
            && !self.counts_envoy_hits(request, &planned[0])
        {
            let p = planned.pop().expect("one planned check");
            let (decision, store_failed) = self.check_one(&p).await;
            let descriptor = p.descriptor;
            let allowed = decision.allowed
                || (global_quota
                    && any_quota_passes(request.descriptors.len(), &matches.unlimited, |i| {
                        i == descriptor
                    }));
            let mut verdict = Verdict {
                allowed,
                limits: Vec::with_capacity(1),
                unlimited: matches.unlimited,
            };
            self.record(&rules, request, p, decision, store_failed, &mut verdict);
            self.metrics.observe_latency(started.elapsed());
            return Ok(verdict);
        }

        // Envoy's per-descriptor hits_addend on Envoy-style limits is counted as Envoy counts
        // it, first and on its own (`check_envoy_hits`); when it goes over, the request is
        // refused and the other enforced limits are only looked at.
        let mut hits: Vec<(usize, (Decision, bool))> = Vec::new();
        for (i, p) in planned.iter().enumerate() {
            if !p.mode.enforces() || !request.descriptors[p.descriptor].envoy_hits {
                continue;
            }
            if let Some(over) = over_policy(&p.policy) {
                hits.push((i, self.check_envoy_hits(p, over).await));
            }
        }
        let hits_over = hits.iter().any(|(_, (d, _))| !d.allowed);

        // Enforced limits are all-or-nothing together; shadow and soft limits count on their
        // own, so that one of them refusing never stops a passing request from being counted.
        let (enforced, observed): (Vec<usize>, Vec<usize>) = (0..planned.len())
            .filter(|i| !hits.iter().any(|(h, _)| h == i))
            .partition(|&i| planned[i].mode.enforces());
        let quota = planned.iter().any(|p| p.quota);
        let (a, b) = if hits_over {
            let (decisions, failed) = self.check_group(&planned, &enforced, true).await;
            let a = Enforced {
                allowed: false,
                decisions: decisions.into_iter().map(|d| (d, failed)).collect(),
            };
            (a, self.check_group(&planned, &observed, false).await)
        } else if observed.is_empty() {
            (
                self.check_enforced(&planned, &enforced, quota).await,
                (Vec::new(), false),
            )
        } else {
            tokio::join!(
                self.check_enforced(&planned, &enforced, quota),
                self.check_group(&planned, &observed, false)
            )
        };
        // Under the service-wide quota mode every limit is a quota limit, and a descriptor no
        // rule matched counts as a quota descriptor that passed, as Envoy counts it.
        let allowed = !hits_over
            && (a.allowed
                || (global_quota && {
                    let refused = refused_descriptors(&planned, &a);
                    any_quota_passes(request.descriptors.len(), &matches.unlimited, |i| {
                        refused.contains(&i)
                    })
                }));
        // Each planned check's decision, and whether it came from the fallback. With no shadow
        // or soft limit and no Envoy hits (the usual case), the enforced group is every check,
        // in order.
        let results: Vec<Option<(Decision, bool)>> = if observed.is_empty() && hits.is_empty() {
            a.decisions.into_iter().map(Some).collect::<Vec<_>>()
        } else {
            let mut results = vec![None; planned.len()];
            for (i, d) in enforced.iter().zip(a.decisions) {
                results[*i] = Some(d);
            }
            for (i, d) in observed.iter().zip(b.0) {
                results[*i] = Some((d, b.1));
            }
            for (i, d) in hits {
                results[i] = Some(d);
            }
            results
        };
        let mut verdict = Verdict {
            allowed,
            limits: Vec::with_capacity(planned.len()),
            unlimited: matches.unlimited,
        };
        for (p, r) in planned.into_iter().zip(results) {
            if let Some((decision, store_failed)) = r {
                self.record(&rules, request, p, decision, store_failed, &mut verdict);
            }
        }
        self.metrics.observe_latency(started.elapsed());
        Ok(verdict)
    }

    /// Adds the decision of planned check `p` to `verdict`, and counts it in the metrics.
    fn record(
        &self,
        rules: &Arc<RuleSet>,
        request: &LimitRequest,
        p: Planned,
        decision: Decision,
        store_failed: bool,
        verdict: &mut Verdict,
    ) {
        let enforced = p.mode.enforces();
        let outcome = match (decision.allowed, enforced, store_failed) {
            (_, _, true) => Outcome::StoreError,
            (true, _, _) => Outcome::Allowed,
            (false, true, _) => Outcome::Limited,
            (false, false, _) => Outcome::ShadowLimited,
        };
        let name: Arc<str> = match &p.rule {
            Some(r) => r.name.clone().unwrap_or_else(|| r.path.clone()),
            None => Arc::from("override"),
        };
        let per_value = p
            .rule
            .as_ref()
            .and_then(|r| r.metric_label(&request.descriptors[p.descriptor]));
        match (&p.rule, per_value) {
            (_, Some(label)) => self.metrics.decision(&request.domain, &label, outcome),
            (Some(rule), None) => self.count(rules, rule, &request.domain, &name, outcome),
            (None, None) => self.metrics.decision(&request.domain, &name, outcome),
        }
        if outcome == Outcome::Limited {
            self.metrics.limited_key(&p.key);
        }
        verdict.limits.push(LimitResult {
            descriptor: p.descriptor,
            key: p.key,
            name,
            policy: p.policy,
            rule: p.rule,
            mode: p.mode,
            quota: p.quota,
            decision,
            outcome,
        });
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

    /// Checks the enforced limits at `which` all-or-nothing. With quota limits among them
    /// (`quota`), Envoy's `quota_mode` applies: a quota descriptor that is refused drops out
    /// and the rest are checked again without it, so that the request passes, consuming from
    /// every other limit, as long as one quota descriptor admits it. A refused quota
    /// descriptor's decisions are from the round that refused it, which consumed nothing.
    async fn check_enforced(&self, planned: &[Planned], which: &[usize], quota: bool) -> Enforced {
        let (decisions, failed) = self.check_group(planned, which, false).await;
        let mut out = Enforced {
            allowed: decisions.iter().all(|d| d.allowed),
            decisions: decisions.into_iter().map(|d| (d, failed)).collect(),
        };
        if out.allowed || !quota {
            return out;
        }
        // Positions in `which` still checked; each round drops at least one quota descriptor.
        let mut active: Vec<usize> = (0..which.len()).collect();
        loop {
            let refused = |k: &usize| !out.decisions[*k].0.allowed;
            if active
                .iter()
                .any(|k| refused(k) && !planned[which[*k]].quota)
            {
                return out;
            }
            let dropped: Vec<usize> = active
                .iter()
                .filter(|k| refused(k))
                .map(|k| planned[which[*k]].descriptor)
                .collect();
            active.retain(|k| !dropped.contains(&planned[which[*k]].descriptor));
            if !active.iter().any(|k| planned[which[*k]].quota) {
                return out;
            }
            let again: Vec<usize> = active.iter().map(|k| which[*k]).collect();
            let (decisions, failed) = self.check_group(planned, &again, false).await;
            out.allowed = decisions.iter().all(|d| d.allowed);
            for (k, d) in active.iter().zip(decisions) {
                out.decisions[*k] = (d, failed);
            }
            if out.allowed {
                return out;
            }
        }
    }

    /// Envoy's per-descriptor `hits_addend` on an Envoy-style limit `p`, counted as
    /// envoyproxy/ratelimit counts it (`over` is [`over_policy`] of its policy). The counter
    /// holds at most its limit; what a report adds beyond it goes to a second counter of the
    /// same window (the key with `:over`), so the count is the two together:
    /// - a cost of 0 is over the limit only when the count is above it (at exactly the limit it
    ///   passes, as in Envoy);
    /// - a cost that fits is counted like any other; one that does not is counted anyway: what
    ///   fits fills the limit and the rest goes over it, in one atomic call (taken again if a
    ///   concurrent request took the room meanwhile), and the answer is `OVER_LIMIT`.
    async fn check_envoy_hits(&self, p: &Planned, over: Policy) -> (Decision, bool) {
        let over = Planned {
            key: over_key(&p.key),
            policy: Arc::new(over),
            cost: 0,
            ..p.clone()
        };
        if p.cost == 0 {
            let (ds, failed) = self.check_group(&[p.clone(), over], &[0, 1], false).await;
            let (mut d, beyond) = (ds[0], OVER_CAPACITY.saturating_sub(ds[1].remaining));
            if !failed {
                d.allowed = beyond == 0;
            }
            if d.allowed {
                d.retry_after = Duration::ZERO;
            }
            return (d, failed);
        }
        let (first, failed) = self.check_one(p).await;
        if first.allowed || failed {
            return (first, failed);
        }
        let mut room = first.remaining;
        for _ in 0..MAX_REPORT_ROUNDS {
            let fits = room.min(p.cost);
            let pair = [
                Planned {
                    cost: fits,
                    ..p.clone()
                },
                Planned {
                    cost: p.cost - fits,
                    ..over.clone()
                },
            ];
            let which: &[usize] = if fits > 0 { &[0, 1] } else { &[1] };
            let (ds, failed) = self.check_group(&pair, which, false).await;
            if failed || ds.iter().all(|d| d.allowed) {
                let mut d = first;
                d.remaining = 0;
                return (d, failed);
            }
            room = ds[0].remaining;
        }
        (first, false)
    }

    /// Whether planned check `p` counts Envoy's `hits_addend` Envoy's way
    /// ([`Limiter::check_envoy_hits`]): an enforced Envoy-style limit of a descriptor that sent
    /// one.
    fn counts_envoy_hits(&self, request: &LimitRequest, p: &Planned) -> bool {
        p.mode.enforces()
            && request.descriptors[p.descriptor].envoy_hits
            && over_policy(&p.policy).is_some()
    }

    /// One planned check on its own: decided at once where the store can
    /// ([`DynStore::check_now`], the memory store), without a boxed future or a vector, and
    /// through [`DynStore::check`] otherwise.
    async fn check_one(&self, p: &Planned) -> (Decision, bool) {
        let check = Check::new(&p.key, &p.policy, p.cost);
        let result = match self.store.check_now(check) {
            Some(result) => result,
            None => self
                .store
                .check(std::slice::from_ref(&check))
                .await
                .map(|ds| ds[0]),
        };
        match result {
            Ok(d) => (d, false),
            Err(e) => {
                let ds = self
                    .without_store(std::slice::from_ref(p), &[0], &[check], &e)
                    .await;
                (ds[0], true)
            }
        }
    }

    /// Checks the planned checks at `which` atomically; returns their decisions, and whether
    /// they came from the fallback because the store failed. `peek` looks without consuming:
    /// every cost is taken as 0.
    async fn check_group(
        &self,
        planned: &[Planned],
        which: &[usize],
        peek: bool,
    ) -> (Vec<Decision>, bool) {
        if which.is_empty() {
            return (Vec::new(), false);
        }
        let checks: Vec<Check<'_>> = which
            .iter()
            .map(|&i| {
                let cost = if peek { 0 } else { planned[i].cost };
                Check::new(&planned[i].key, &planned[i].policy, cost)
            })
            .collect();
        match self.store.check(&checks).await {
            Ok(decisions) => (decisions, false),
            Err(e) => (self.without_store(planned, which, &checks, &e).await, true),
        }
    }

    /// The decisions of `checks` (the planned checks at `which`) when the store failed with
    /// `e`: each rule's `on_store_error`.
    async fn without_store(
        &self,
        planned: &[Planned],
        which: &[usize],
        checks: &[Check<'_>],
        e: &sluice_core::StoreError,
    ) -> Vec<Decision> {
        let before = self.metrics.store_error();
        // The first errors of an outage, then every power of two: enough to see it start and
        // last, without a log line per request while the store is down.
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
        decide_without_store(checks, &modes, &self.local, self.deny_retry).await
    }
}

/// The capacity of the counter that holds what Envoy-counted usage adds beyond a limit: far
/// beyond any real count, and exact in every store (a double holds it).
const OVER_CAPACITY: u64 = 1 << 40;

/// How many times a report that did not fit is tried again when concurrent requests keep
/// taking the room it would fill.
const MAX_REPORT_ROUNDS: usize = 8;

/// The key of the counter that holds what Envoy-counted usage adds beyond the limit of `key`:
/// in the same Cluster slot, as the hash tag is kept.
fn over_key(key: &str) -> String {
    format!("{key}:over")
}

/// The policy of the counter beside an Envoy-style limit (a fixed window aligned on the clock,
/// as every limit of Envoy's format is) that holds the usage reported beyond it: the same
/// windows, [`OVER_CAPACITY`] wide. `None` for other policies, which count Sluice's way.
fn over_policy(policy: &Policy) -> Option<Policy> {
    match policy {
        Policy::FixedWindow(p) if matches!(p.alignment(), Alignment::Clock { .. }) => {
            FixedWindow::new(OVER_CAPACITY, p.window(), p.alignment())
                .ok()
                .map(Policy::from)
        }
        _ => None,
    }
}

/// The enforced limits' decisions: each with whether it came from the fallback.
struct Enforced {
    /// Whether every enforced limit still checked admitted the request.
    allowed: bool,
    decisions: Vec<(Decision, bool)>,
}

/// The descriptors with an enforced limit that refused, among the enforced limits' decisions.
fn refused_descriptors(planned: &[Planned], enforced: &Enforced) -> Vec<usize> {
    let enforced_positions = (0..planned.len()).filter(|&i| planned[i].mode.enforces());
    enforced_positions
        .zip(&enforced.decisions)
        .filter(|(_, (d, _))| !d.allowed)
        .map(|(i, _)| planned[i].descriptor)
        .collect()
}

/// Under the service-wide quota mode, whether some descriptor passes: one that is not
/// unlimited and none of whose enforced limits refused (`refused`; one without any limit
/// included).
fn any_quota_passes(
    descriptors: usize,
    unlimited: &[usize],
    refused: impl Fn(usize) -> bool,
) -> bool {
    (0..descriptors).any(|i| !unlimited.contains(&i) && !refused(i))
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
        mode: Mode::Enforce,
        quota: false,
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
}
