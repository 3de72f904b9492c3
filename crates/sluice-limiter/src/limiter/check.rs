//! The second step of a decision: the store's answer to each planned check. Enforced limits go
//! to the store together, all or nothing; shadow and soft limits go separately, so that one of
//! them refusing never stops a passing request from being counted. Envoy's `quota_mode` drops
//! the quota descriptors that refuse and checks the rest again, and Envoy's per-descriptor
//! `hits_addend` is counted Envoy's way (`envoy_hits.rs`), first: a quota descriptor it finds
//! over drops out like any refused quota descriptor, before the rest is counted. When the store
//! fails, each rule's `on_store_error` decides (`sluice_core::decide_without_store`).

use sluice_core::{Check, Decision, OnStoreError, StoreError, decide_without_store};
use sluice_rules::MatchedCheck;

use super::Limiter;
use super::envoy_hits::reported_beyond;
use super::plan::Plan;
use crate::request::LimitRequest;

/// The store's answer to one planned check.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answer {
    /// What the store decided, or the rule's `on_store_error`.
    pub(super) decision: Decision,
    /// Whether the decision came from `on_store_error` because the store failed.
    pub(super) store_failed: bool,
}

/// The answers to a plan, in plan order.
pub(super) enum Answers {
    /// The usual request's one check, answered without a vector.
    One(Answer),
    /// Any other request's: each planned check's answer at its position.
    Each(Vec<Option<Answer>>),
}

impl IntoIterator for Answers {
    type Item = Option<Answer>;
    type IntoIter =
        std::iter::Chain<std::option::IntoIter<Option<Answer>>, std::vec::IntoIter<Option<Answer>>>;

    fn into_iter(self) -> Self::IntoIter {
        let (one, each) = match self {
            Answers::One(answer) => (Some(Some(answer)), Vec::new()),
            Answers::Each(each) => (None, each),
        };
        one.into_iter().chain(each)
    }
}

/// What the store said of a plan.
pub(super) struct Checked {
    /// Whether every enforced limit admitted the request, Envoy's `quota_mode` applied.
    pub(super) allowed: bool,
    /// Whether usage reported Envoy's way went over a limit that is not a quota limit: the
    /// request is refused. (Over a quota limit, its descriptor only drops out, as Envoy's
    /// `quota_mode` has it.)
    pub(super) over_reported: bool,
    /// Each planned check's answer.
    pub(super) answers: Answers,
}

/// The enforced limits' answers.
struct Enforced {
    /// Whether every enforced limit still checked admitted the request.
    allowed: bool,
    /// Each enforced limit's answer, in the order they were asked for (always present: a
    /// limit not counted is looked at).
    answers: Vec<Option<Answer>>,
}

impl Limiter {
    /// The store's answers to `plan`'s checks for `request`.
    pub(super) async fn check(&self, request: &LimitRequest, plan: &Plan) -> Checked {
        let checks = &plan.checks;
        // The usual request: one enforced limit, not counted Envoy's way. Its check goes to the
        // store on its own ([`Limiter::check_one`]), without the groups and vectors below; with
        // one check, quota mode has nothing to drop and retry.
        if let [only] = checks.as_slice()
            && only.rule.mode.enforces()
            && reported_beyond(request, only).is_none()
        {
            let answer = self.check_one(only).await;
            return Checked {
                allowed: answer.decision.allowed,
                over_reported: false,
                answers: Answers::One(answer),
            };
        }
        // On the heap: its groups, joins and fallbacks make a future of about 1.5 KiB, which
        // every request's future would otherwise carry and copy into its box, used or not.
        Box::pin(self.check_many(request, plan)).await
    }

    /// [`Limiter::check`] of any plan but a single enforced limit.
    async fn check_many(&self, request: &LimitRequest, plan: &Plan) -> Checked {
        let checks = &plan.checks;

        // Envoy's per-descriptor hits_addend on Envoy-style limits is counted as Envoy counts
        // it, first and on its own; when it goes over an ordinary limit, the request is refused
        // and the other enforced limits are only looked at. Over a quota limit, its descriptor
        // drops out of the request as a refused quota descriptor does (`check_enforced`).
        let mut hits: Vec<(usize, Answer)> = Vec::new();
        for (i, c) in checks.iter().enumerate() {
            if let Some(over) = reported_beyond(request, c) {
                hits.push((i, self.check_envoy_hits(c, over).await));
            }
        }
        let over_reported = hits
            .iter()
            .any(|(i, a)| !a.decision.allowed && !plan.quota(&checks[*i]));

        let (enforced, observed): (Vec<usize>, Vec<usize>) = (0..checks.len())
            .filter(|i| !hits.iter().any(|(h, _)| h == i))
            .partition(|&i| checks[i].rule.mode.enforces());
        // `held`: the enforced limits' answers; `seen`: the shadow and soft limits' decisions.
        let (held, (seen, seen_failed)) = if over_reported {
            let (decisions, store_failed) = self.check_group(checks, &enforced, true).await;
            let held = Enforced {
                allowed: false,
                answers: answers(decisions, store_failed).map(Some).collect(),
            };
            (held, self.check_group(checks, &observed, false).await)
        } else if observed.is_empty() {
            (
                self.check_enforced(plan, &enforced, &hits).await,
                (Vec::new(), false),
            )
        } else {
            tokio::join!(
                self.check_enforced(plan, &enforced, &hits),
                self.check_group(checks, &observed, false)
            )
        };
        // With no shadow or soft limit and no Envoy hits (the usual case), the enforced group
        // is every check, in order.
        let answers = if observed.is_empty() && hits.is_empty() {
            held.answers
        } else {
            let mut each = vec![None; checks.len()];
            for (&i, answer) in enforced.iter().zip(held.answers) {
                each[i] = answer;
            }
            for (&i, answer) in observed.iter().zip(answers(seen, seen_failed)) {
                each[i] = Some(answer);
            }
            for (i, answer) in hits {
                each[i] = Some(answer);
            }
            each
        };
        Checked {
            allowed: held.allowed,
            over_reported,
            answers: Answers::Each(answers),
        }
    }

    /// Checks the enforced limits at `which` all-or-nothing, beside the Envoy-counted
    /// `settled` answers (counted already, on their own). With quota limits in the plan,
    /// Envoy's `quota_mode` applies: a quota descriptor that is refused drops out and the rest
    /// are checked again without it, so that the request passes, consuming from every other
    /// limit, as long as one quota descriptor admits it (a settled one included). A quota
    /// descriptor `settled` refused drops out before anything is counted. A refused quota
    /// descriptor's answers are from the round that refused it, which consumed nothing, or,
    /// for one that dropped out first, from a look that counts nothing.
    async fn check_enforced(
        &self,
        plan: &Plan,
        which: &[usize],
        settled: &[(usize, Answer)],
    ) -> Enforced {
        let checks = &plan.checks;
        let descriptor = |k: usize| checks[which[k]].descriptor;
        // The descriptors out of the request, and the positions in `which` still checked.
        let mut out: Vec<usize> = settled
            .iter()
            .filter(|(_, a)| !a.decision.allowed)
            .map(|(i, _)| checks[*i].descriptor)
            .collect();
        let (mut active, first_out): (Vec<usize>, Vec<usize>) =
            (0..which.len()).partition(|&k| !out.contains(&descriptor(k)));
        let mut answers = vec![None; which.len()];
        self.look(plan, which, &first_out, &mut answers).await;
        loop {
            // Once a quota descriptor is out, the request passes only while one still stands.
            let standing = active.iter().any(|&k| plan.quota(&checks[which[k]]))
                || settled.iter().any(|(i, a)| {
                    a.decision.allowed
                        && plan.quota(&checks[*i])
                        && !out.contains(&checks[*i].descriptor)
                });
            if !out.is_empty() && !standing {
                let unanswered: Vec<usize> = active
                    .iter()
                    .copied()
                    .filter(|&k| answers[k].is_none())
                    .collect();
                self.look(plan, which, &unanswered, &mut answers).await;
                return Enforced {
                    allowed: false,
                    answers,
                };
            }
            // The first round of a request with nothing out asks for `which` as it is.
            let (decisions, store_failed) = if active.len() == which.len() {
                self.check_group(checks, which, false).await
            } else {
                let again: Vec<usize> = active.iter().map(|&k| which[k]).collect();
                self.check_group(checks, &again, false).await
            };
            let allowed = decisions.iter().all(|d| d.allowed);
            for (&k, answer) in active.iter().zip(self::answers(decisions, store_failed)) {
                answers[k] = Some(answer);
            }
            let refused = |k: &usize| answers[*k].is_some_and(|a| !a.decision.allowed);
            if allowed
                || active
                    .iter()
                    .any(|k| refused(k) && !plan.quota(&checks[which[*k]]))
            {
                return Enforced { allowed, answers };
            }
            // Only quota descriptors refused: each round drops at least one.
            out.extend(active.iter().filter(|k| refused(k)).map(|&k| descriptor(k)));
            active.retain(|&k| !out.contains(&descriptor(k)));
        }
    }

    /// Looks at the enforced limits at positions `at` of `which`, counting nothing, into
    /// `answers`: for limits of a request that is refused, or of a descriptor that dropped out.
    async fn look(
        &self,
        plan: &Plan,
        which: &[usize],
        at: &[usize],
        answers: &mut [Option<Answer>],
    ) {
        if at.is_empty() {
            return;
        }
        let indices: Vec<usize> = at.iter().map(|&k| which[k]).collect();
        let (decisions, store_failed) = self.check_group(&plan.checks, &indices, true).await;
        for (&k, answer) in at.iter().zip(self::answers(decisions, store_failed)) {
            answers[k] = Some(answer);
        }
    }

    /// One planned check on its own: decided at once where the store can
    /// ([`DynStore::check_now`](sluice_core::DynStore::check_now), the memory store), without a
    /// boxed future or a vector, and through the batch otherwise.
    pub(super) async fn check_one(&self, c: &MatchedCheck) -> Answer {
        let check = c.as_check();
        let result = match self.store.check_now(check) {
            Some(result) => result,
            None => self
                .store
                .check(std::slice::from_ref(&check))
                .await
                .map(|ds| ds[0]),
        };
        match result {
            Ok(decision) => Answer {
                decision,
                store_failed: false,
            },
            Err(e) => {
                let on_error = |_| c.rule.on_store_error;
                // On the heap, as above: the fallback's future is large and seldom needed.
                let ds =
                    Box::pin(self.without_store(std::slice::from_ref(&check), on_error, &e)).await;
                Answer {
                    decision: ds[0],
                    store_failed: true,
                }
            }
        }
    }

    /// Checks the planned checks at `which` atomically; their decisions, and whether they came
    /// from the fallback because the store failed. `peek` looks without consuming: every cost
    /// is taken as 0.
    pub(super) async fn check_group(
        &self,
        checks: &[MatchedCheck],
        which: &[usize],
        peek: bool,
    ) -> (Vec<Decision>, bool) {
        if which.is_empty() {
            return (Vec::new(), false);
        }
        let batch: Vec<Check<'_>> = which
            .iter()
            .map(|&i| {
                let check = checks[i].as_check();
                let cost = if peek { 0 } else { check.cost };
                Check { cost, ..check }
            })
            .collect();
        self.check_batch(&batch, |k| checks[which[k]].rule.on_store_error)
            .await
    }

    /// Checks `batch` atomically; its decisions, and whether they came from the fallback
    /// (`on_error` of each check's position) because the store failed.
    pub(super) async fn check_batch(
        &self,
        batch: &[Check<'_>],
        on_error: impl Fn(usize) -> OnStoreError,
    ) -> (Vec<Decision>, bool) {
        match self.store.check(batch).await {
            Ok(decisions) => (decisions, false),
            Err(e) => (self.without_store(batch, on_error, &e).await, true),
        }
    }

    /// The decisions of `batch` when the store failed with `e`: each check's `on_store_error`
    /// (`on_error` of its position). When they admit the batch, the store is told, so that a
    /// store that pushes usage later (the hybrid store) counts what was admitted without it.
    pub(super) async fn without_store(
        &self,
        batch: &[Check<'_>],
        on_error: impl Fn(usize) -> OnStoreError,
        e: &StoreError,
    ) -> Vec<Decision> {
        let before = self.metrics.store_error();
        // The first errors of an outage, then every power of two: enough to see it start and
        // last, without a log line per request while the store is down.
        if before < 8 || before.is_power_of_two() {
            tracing::warn!(error = %e, transient = e.is_transient(), errors_so_far = before + 1, "store failed; applying on_store_error");
        }
        let modes: Vec<OnStoreError> = (0..batch.len()).map(on_error).collect();
        let decisions = decide_without_store(batch, &modes, &self.local, self.deny_retry).await;
        if decisions.iter().all(|d| d.allowed) {
            self.store.admitted_without_store(batch);
        }
        decisions
    }
}

/// `decisions` as answers, each from the fallback when `store_failed`.
fn answers(decisions: Vec<Decision>, store_failed: bool) -> impl Iterator<Item = Answer> {
    decisions.into_iter().map(move |decision| Answer {
        decision,
        store_failed,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use sluice_core::{Check, Decision, Policy, Store, StoreError, StoreResult};
    use sluice_rules::Reloader;

    use crate::metrics::Metrics;
    use crate::request::{LimitRequest, RequestDescriptor};
    use crate::{Limiter, Verdict};

    /// A store that is always away, and keeps what it is told `on_store_error` admitted.
    #[derive(Default)]
    struct Away {
        told: Mutex<Vec<(String, u64)>>,
    }

    impl Store for Away {
        async fn check(&self, _checks: &[Check<'_>]) -> StoreResult<Vec<Decision>> {
            Err(StoreError::Unavailable("away".into()))
        }

        async fn peek(&self, _key: &str, _policy: &Policy) -> StoreResult<Decision> {
            Err(StoreError::Unavailable("away".into()))
        }

        async fn reset(&self, _key: &str) -> StoreResult<bool> {
            Err(StoreError::Unavailable("away".into()))
        }

        fn admitted_without_store(&self, checks: &[Check<'_>]) {
            let mut told = self.told.lock().unwrap();
            told.extend(checks.iter().map(|c| (c.key.to_owned(), c.cost)));
        }
    }

    async fn decide(store: &Arc<Away>, on_store_error: &str, value: &str) -> Verdict {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        let rules = format!(
            "domain: d\non_store_error: {on_store_error}\ndescriptors:\n  - key: k\n    \
             rate_limit: {{unit: minute, requests_per_unit: 100}}\n"
        );
        std::fs::write(&path, rules).unwrap();
        let limiter = Limiter::new(
            Reloader::new(vec![path]).unwrap(),
            store.clone(),
            Arc::new(Metrics::new()),
        );
        let request = LimitRequest {
            domain: "d".into(),
            descriptors: vec![RequestDescriptor {
                entries: vec![("k".into(), value.into())],
                ..Default::default()
            }],
            cost: 3,
        };
        limiter.decide(&request).await.unwrap()
    }

    /// What `on_store_error: allow` admits while the store is away is told to the store, with
    /// its cost, so that a store that pushes usage later counts it; what `deny` refuses is not.
    #[tokio::test]
    async fn the_store_hears_what_on_store_error_admitted() {
        let store = Arc::new(Away::default());
        assert!(decide(&store, "allow", "a").await.allowed);
        assert!(!decide(&store, "deny", "b").await.allowed);
        let told = store.told.lock().unwrap().clone();
        assert_eq!(told.len(), 1, "{told:?}");
        assert!(told[0].0.contains('a') && told[0].1 == 3, "{told:?}");
    }
}
