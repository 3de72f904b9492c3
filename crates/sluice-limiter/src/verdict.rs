//! The answer to a whole request, and every judgement a front end needs from it: which limits
//! refuse, which one is tightest, which show in the rate-limit fields, and what each descriptor's
//! status is. Front ends (gRPC, `/json`, `/v1/check`, the gateway, the tower layer) only format
//! what is decided here, so they cannot disagree.

use std::cmp::Reverse;
use std::sync::Arc;

use http::{HeaderName, HeaderValue};
use sluice_core::{Decision, Policy};
use sluice_rules::{Mode, Rule};

use crate::headers::{HeaderStyle, rate_limit_headers, retry_after_secs};
use crate::metrics::Outcome;

/// How one limit of a request was decided: the rule that limits it, and the store's answer.
#[derive(Debug, Clone)]
pub struct LimitResult {
    /// Which descriptor it belongs to.
    pub descriptor: usize,
    /// The counter key.
    pub key: String,
    /// The rule: its policy, mode, name and action. A per-request override is a rule made for
    /// the request ([`Rule::is_standalone`]), enforced and named `override`.
    pub rule: Arc<Rule>,
    /// The store's answer (or the fallback's).
    pub decision: Decision,
    /// What it counts as.
    pub outcome: Outcome,
}

impl LimitResult {
    /// The name for headers and metrics: the rule's `name`, else its path.
    pub fn name(&self) -> &str {
        self.rule.label()
    }

    /// The algorithm and its parameters.
    pub fn policy(&self) -> &Policy {
        &self.rule.policy
    }

    /// How a denial counts.
    pub fn mode(&self) -> Mode {
        self.rule.mode
    }

    /// Whether a denial on this limit refuses the request (it is neither shadow nor soft).
    pub fn enforced(&self) -> bool {
        self.mode().enforces()
    }

    /// Whether this limit refuses the request.
    pub fn refuses(&self) -> bool {
        self.enforced() && !self.decision.allowed
    }

    /// Whether this limit shows in the answer's rate-limit fields: every limit but a shadow one,
    /// which is a dark launch and must stay invisible.
    pub fn shown(&self) -> bool {
        self.mode().shown()
    }

    /// How much this limit restricts the request, larger meaning tighter. This is the one
    /// ordering of "tightest": a limit that refuses the request first, then any denial, then
    /// the longer wait, then the fewer remaining.
    pub(crate) fn restriction(&self) -> impl Ord + use<> {
        let d = &self.decision;
        (
            self.refuses(),
            !d.allowed,
            d.retry_after,
            d.delay,
            Reverse(d.remaining),
        )
    }
}

/// What a descriptor's status says, as Envoy's `DescriptorStatus` and `/v1/check` report it.
#[derive(Debug, Clone, Copy)]
pub struct DescriptorStatus<'a> {
    /// Whether a limit of the descriptor refuses the request.
    pub refused: bool,
    /// The limit the status describes: the tightest shown limit of the descriptor, else (a
    /// descriptor with only shadow limits, as Envoy reports shadow mode) its tightest limit.
    /// `None` when no limit applied.
    pub limit: Option<&'a LimitResult>,
}

/// The answer to a whole request.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// Whether the request may go ahead.
    pub allowed: bool,
    /// Every limit that applied, in descriptor order.
    pub limits: Vec<LimitResult>,
    /// Indexes of descriptors that matched an `unlimited` rule.
    pub unlimited: Vec<usize>,
}

impl Verdict {
    /// The limits that applied to descriptor `i`.
    pub fn for_descriptor(&self, i: usize) -> impl Iterator<Item = &LimitResult> {
        self.limits.iter().filter(move |c| c.descriptor == i)
    }

    /// The limits that refuse the request.
    pub fn refusing(&self) -> impl Iterator<Item = &LimitResult> {
        self.limits.iter().filter(|c| c.refuses())
    }

    /// The limits that show in the answer's rate-limit fields.
    pub fn shown(&self) -> impl Iterator<Item = &LimitResult> {
        self.limits.iter().filter(|c| c.shown())
    }

    /// Descriptor `i`'s status.
    pub fn status(&self, i: usize) -> DescriptorStatus<'_> {
        let by_restriction = |l: &&LimitResult| l.restriction();
        let limit = tightest(self.for_descriptor(i).filter(|c| c.shown()), by_restriction)
            .or_else(|| tightest(self.for_descriptor(i), by_restriction));
        DescriptorStatus {
            refused: self.for_descriptor(i).any(LimitResult::refuses),
            limit,
        }
    }

    /// The tightest of the limits shown: the one the legacy fields describe.
    pub fn tightest_shown(&self) -> Option<&LimitResult> {
        tightest(self.shown(), |l| l.restriction())
    }

    /// The rate-limit fields of the answer in `style`: every shown limit in the IETF fields, the
    /// tightest in the legacy ones, and `Retry-After` when the request is refused.
    pub fn headers(&self, style: HeaderStyle) -> Vec<(HeaderName, HeaderValue)> {
        rate_limit_headers(self.limits.iter().filter(|c| c.shown()), style)
    }

    /// How long a refused request should wait, in whole seconds: the longest wait among the
    /// limits that refuse it. `None` when it is not refused, or can never pass.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.refusing()
            .filter_map(|c| retry_after_secs(&c.decision))
            .max()
    }
}

/// The tightest of `items`, the one whose `restriction` is largest; of equals, the first. The
/// one reduce every "which is tightest" question goes through: a verdict's limits by
/// `LimitResult::restriction`, the rate-limit fields' too, and Envoy's service-wide headers
/// (sluice-server's `compat.rs`) by envoyproxy/ratelimit's order of descriptor statuses.
///
/// ```
/// use sluice_limiter::tightest;
///
/// let waits = [("a", 3), ("b", 7), ("c", 7)];
/// assert_eq!(tightest(waits, |(_, wait)| *wait), Some(("b", 7)));
/// ```
pub fn tightest<T, K: Ord>(
    items: impl IntoIterator<Item = T>,
    restriction: impl Fn(&T) -> K,
) -> Option<T> {
    let mut best: Option<(K, T)> = None;
    for item in items {
        let r = restriction(&item);
        if best.as_ref().is_none_or(|(b, _)| r > *b) {
            best = Some((r, item));
        }
    }
    best.map(|(_, item)| item)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sluice_core::{Rate, TokenBucket};

    use super::*;

    fn limit(name: &str, mode: Mode, allowed: bool, remaining: u64, retry_s: u64) -> LimitResult {
        let policy = Policy::from(TokenBucket::new(10, Rate::per_second(10)).unwrap());
        LimitResult {
            descriptor: 0,
            key: name.to_owned(),
            rule: tests_support::rule(name, policy, mode),
            decision: Decision {
                allowed,
                limit: 10,
                remaining,
                reset_after: Duration::from_secs(1),
                retry_after: Duration::from_secs(retry_s),
                delay: Duration::ZERO,
            },
            outcome: Outcome::Allowed,
        }
    }

    #[test]
    fn a_refusing_limit_is_tighter_than_a_soft_denial_with_a_longer_wait() {
        let verdict = Verdict {
            allowed: false,
            limits: vec![
                limit("soft", Mode::Soft, false, 0, 60),
                limit("burst", Mode::Enforce, false, 0, 1),
                limit("dark", Mode::Shadow, false, 0, 3600),
            ],
            unlimited: Vec::new(),
        };
        let status = verdict.status(0);
        assert!(status.refused);
        assert_eq!(status.limit.unwrap().name(), "burst");
        assert_eq!(verdict.tightest_shown().unwrap().name(), "burst");
        let headers = verdict.headers(HeaderStyle::Both);
        let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        // The legacy fields and Retry-After describe the limit the status names; the shadow
        // limit shows nowhere.
        assert_eq!(get("retry-after").unwrap(), "1");
        let ietf = get("ratelimit").unwrap();
        assert!(!ietf.to_str().unwrap().contains("dark"), "{ietf:?}");
        assert!(ietf.to_str().unwrap().contains("soft"), "{ietf:?}");
        assert_eq!(verdict.retry_after_secs(), Some(1));
    }

    #[test]
    fn a_descriptor_with_only_shadow_limits_reports_one_as_envoy_does() {
        let verdict = Verdict {
            allowed: true,
            limits: vec![limit("dark", Mode::Shadow, false, 0, 5)],
            unlimited: Vec::new(),
        };
        let status = verdict.status(0);
        assert!(!status.refused);
        assert_eq!(status.limit.unwrap().name(), "dark");
        assert!(verdict.headers(HeaderStyle::Both).is_empty());
        assert_eq!(verdict.retry_after_secs(), None);
        assert!(verdict.status(1).limit.is_none());
    }
}

/// Rules made in code for the crate's unit tests.
#[cfg(test)]
pub(crate) mod tests_support {
    use std::sync::Arc;

    use sluice_core::Policy;
    use sluice_rules::{Action, LimitConfig, Location, Mode, OnStoreError, Rule};

    /// A standalone rule named `name` of `policy`, counting its denials as `mode` says.
    pub(crate) fn rule(name: &str, policy: Policy, mode: Mode) -> Arc<Rule> {
        let action = match mode {
            Mode::Soft => Action::Soft {
                header: "x-warning".to_owned(),
            },
            Mode::Enforce | Mode::Shadow => Action::Reject,
        };
        let limit = LimitConfig {
            name: Some(Arc::from(name)),
            policy: Arc::new(policy),
            replaces: Vec::new(),
            action,
            shadow: mode == Mode::Shadow,
            on_store_error: OnStoreError::Allow,
            location: Location::start_of(Arc::from("test.yaml")),
        };
        Arc::new(Rule::standalone(limit, Arc::from(name)))
    }
}
