//! The last step of a decision: the verdict, from the plan and the store's answers. Each
//! limit's result is counted in the metrics, and whether the request may go ahead is settled
//! here, with envoyproxy/ratelimit's service-wide quota mode.

use std::sync::Arc;

use sluice_rules::{MatchedCheck, RuleSet};

use super::Limiter;
use super::check::{Answer, Checked};
use super::plan::Plan;
use crate::metrics::Outcome;
use crate::request::LimitRequest;
use crate::verdict::{LimitResult, Verdict};

impl Limiter {
    /// The verdict on `request`, planned as `plan` under `rules`, from the store's answers.
    pub(super) fn assemble(
        &self,
        rules: &Arc<RuleSet>,
        request: &LimitRequest,
        plan: Plan,
        checked: Checked,
    ) -> Verdict {
        let Plan {
            checks,
            unlimited,
            quota_mode,
        } = plan;
        let mut limits = Vec::with_capacity(checks.len());
        for (check, answer) in checks.into_iter().zip(checked.answers) {
            if let Some(answer) = answer {
                limits.push(self.result(rules, request, check, answer));
            }
        }
        // Under the service-wide quota mode every limit is a quota limit, and a descriptor no
        // rule matched counts as a quota descriptor that passed, as Envoy counts it.
        let allowed = checked.allowed
            || (quota_mode
                && !checked.over_reported
                && a_descriptor_passes(request.descriptors.len(), &unlimited, &limits));
        Verdict {
            allowed,
            limits,
            unlimited,
        }
    }

    /// The result of planned check `check` with the store's `answer`, counted in the metrics.
    fn result(
        &self,
        rules: &Arc<RuleSet>,
        request: &LimitRequest,
        check: MatchedCheck,
        answer: Answer,
    ) -> LimitResult {
        let Answer {
            decision,
            store_failed,
        } = answer;
        let rule = &check.rule;
        let refund = request.descriptors[check.descriptor].refund;
        let outcome = match (decision.allowed, rule.mode.enforces(), store_failed) {
            (_, _, true) => Outcome::StoreError,
            _ if refund => Outcome::Refunded,
            (true, _, _) => Outcome::Allowed,
            (false, true, _) => Outcome::Limited,
            (false, false, _) => Outcome::ShadowLimited,
        };
        match rule.metric_label(&request.descriptors[check.descriptor]) {
            Some(label) => self.metrics.decision(&request.domain, &label, outcome),
            // A rule made for the request is not the rule set's: its counter is found by its
            // labels, not cached by its address.
            None if rule.is_standalone() => {
                self.metrics
                    .decision(&request.domain, rule.label(), outcome);
            }
            // A rule under a runtime override counts as the set's rule it overrides, whose
            // labels it has, on that rule's cached counter.
            None => {
                let counted = rule.overridden_rule().unwrap_or(rule);
                self.count(rules, counted, &request.domain, outcome);
            }
        }
        if outcome == Outcome::Limited {
            self.metrics.limited_key(&check.key);
        }
        LimitResult {
            descriptor: check.descriptor,
            key: check.key,
            rule: check.rule,
            decision,
            outcome,
        }
    }
}

/// Under the service-wide quota mode, whether some descriptor passes: one that is not
/// unlimited and that no limit refuses (one without any limit included).
fn a_descriptor_passes(descriptors: usize, unlimited: &[usize], limits: &[LimitResult]) -> bool {
    (0..descriptors).any(|i| {
        !unlimited.contains(&i) && !limits.iter().any(|l| l.descriptor == i && l.refuses())
    })
}
