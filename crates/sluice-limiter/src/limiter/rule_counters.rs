//! Each rule's decision counters, so that counting a decision neither copies nor hashes its
//! labels: a rule of the rule set in force is found by its address.

use std::sync::{Arc, PoisonError};

use prometheus_client::metrics::counter::Counter;
use sluice_rules::{Rule, RuleSet};

use super::Limiter;
use crate::metrics::Outcome;

/// Addresses hashed with foldhash: std's SipHash cost about 150 instructions a lookup, one in
/// every decision.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The decision counters of the rules of one rule set, by the rule's address and the outcome.
/// A reload starts afresh; holding the set meanwhile keeps every rule in it alive, so no
/// address can be reused by another rule.
pub(super) struct RuleCounters {
    rules: Arc<RuleSet>,
    by_rule: HashMap<usize, [Option<Counter>; 5]>,
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
        Outcome::Refunded => 4,
    }
}

impl Limiter {
    /// Counts a decision of `rule`, from `rules`, on its cached counter. `rule` must be one of
    /// `rules`' (not [`Rule::is_standalone`]): its address is its identity only while the set
    /// holds it.
    pub(super) fn count(
        &self,
        rules: &Arc<RuleSet>,
        rule: &Arc<Rule>,
        domain: &str,
        outcome: Outcome,
    ) {
        {
            let cache = self.counters.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(counter) = cache.as_ref().and_then(|c| c.get(rules, rule, outcome)) {
                counter.inc();
                return;
            }
        }
        let counter = self.metrics.decision_counter(domain, rule.label(), outcome);
        counter.inc();
        let mut cache = self
            .counters
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let current = cache.as_ref().is_some_and(|c| Arc::ptr_eq(&c.rules, rules));
        if !current {
            *cache = Some(RuleCounters {
                rules: Arc::clone(rules),
                by_rule: HashMap::default(),
            });
        }
        if let Some(cache) = cache.as_mut() {
            cache.by_rule.entry(address(rule)).or_default()[outcome_index(outcome)] = Some(counter);
        }
    }
}
