//! Envoy's refund: a descriptor with `is_negative_hits` gives its `hits_addend` back to every
//! limit it matches instead of taking it, as envoyproxy/ratelimit subtracts it from the counter:
//! in the current window, floored at zero, never past what a limit can hold. Such a descriptor
//! is answered `OK` and counted as `refunded`; the request's other descriptors are decided as
//! usual.

use sluice_core::{Check, Refund};
use sluice_rules::MatchedCheck;

use super::Limiter;
use super::check::{Answer, Answers, Checked};
use super::plan::Plan;
use crate::request::LimitRequest;

impl Limiter {
    /// The store's answers to `plan` when some of its descriptors are refunds: those give
    /// their units back, the rest are checked as [`Limiter::check`] checks them.
    pub(super) async fn check_with_refunds(
        &self,
        request: &LimitRequest,
        plan: Plan,
    ) -> (Plan, Checked) {
        let refunds = |c: &MatchedCheck| request.descriptors[c.descriptor].refund;
        let (given, taken): (Vec<usize>, Vec<usize>) =
            (0..plan.checks.len()).partition(|&i| refunds(&plan.checks[i]));
        let Plan {
            checks,
            unlimited,
            quota_mode,
        } = plan;
        let mut slots: Vec<Option<MatchedCheck>> = checks.into_iter().map(Some).collect();
        let rest = Plan {
            checks: taken.iter().filter_map(|&i| slots[i].take()).collect(),
            unlimited,
            quota_mode,
        };
        let back: Vec<MatchedCheck> = given.iter().filter_map(|&i| slots[i].take()).collect();

        let checked = self.check(request, &rest).await;
        let given_back = self.give_back(&back).await;

        // The plan and its answers in descriptor order again, as the verdict expects them.
        let Plan {
            checks: rest_checks,
            unlimited,
            quota_mode,
        } = rest;
        let mut joined: Vec<(MatchedCheck, Option<Answer>)> = rest_checks
            .into_iter()
            .zip(checked.answers)
            .chain(back.into_iter().zip(given_back.into_iter().map(Some)))
            .collect();
        joined.sort_by_key(|(c, _)| c.descriptor);
        let (checks, answers): (Vec<_>, Vec<_>) = joined.into_iter().unzip();
        (
            Plan {
                checks,
                unlimited,
                quota_mode,
            },
            Checked {
                allowed: checked.allowed,
                over_reported: checked.over_reported,
                answers: Answers::Each(answers),
            },
        )
    }

    /// Gives each check's cost back to its counter; each answer admits, describing the counter
    /// after the refund. When the store fails, nothing is given back, and the answer comes from
    /// the rule's `on_store_error` looked at without consuming.
    async fn give_back(&self, checks: &[MatchedCheck]) -> Vec<Answer> {
        if checks.is_empty() {
            return Vec::new();
        }
        let refunds: Vec<Refund<'_>> = checks
            .iter()
            .map(|c| Refund {
                key: &c.key,
                policy: &c.rule.policy,
                // Nothing of a concurrency limit: only a settle releases a slot.
                units: c.units(false),
            })
            .collect();
        let (decisions, store_failed) = match self.store.refund(&refunds).await {
            Ok(decisions) => (decisions, false),
            Err(e) => {
                let looks: Vec<Check<'_>> = checks
                    .iter()
                    .map(|c| Check {
                        cost: 0,
                        ..c.as_check()
                    })
                    .collect();
                let on_error = |k: usize| checks[k].rule.on_store_error;
                (self.without_store(&looks, on_error, &e).await, true)
            }
        };
        decisions
            .into_iter()
            .map(|mut decision| {
                decision.allowed = true;
                decision.retry_after = std::time::Duration::ZERO;
                Answer {
                    decision,
                    store_failed,
                }
            })
            .collect()
    }
}
