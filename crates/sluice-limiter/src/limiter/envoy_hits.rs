//! Envoy's per-descriptor `hits_addend` on an Envoy-style limit, counted as
//! envoyproxy/ratelimit counts it. The counter holds at most its limit; what a report adds
//! beyond it goes to a second counter of the same window (the key with `:over`), so the count
//! is the two together:
//! - a cost of 0 is over the limit only when the count is above it (at exactly the limit it
//!   passes, as in Envoy), and its reset is the rest of the window even on a counter that holds
//!   nothing yet, as Envoy reports it for every limit it matched;
//! - a cost that fits is counted like any other; one that does not is counted anyway: what fits
//!   fills the limit and the rest goes over it, in one atomic call (taken again if a concurrent
//!   request took the room meanwhile), and the answer is `OVER_LIMIT`.

use std::time::Duration;

use sluice_core::{Check, Policy};
use sluice_rules::MatchedCheck;

use super::Limiter;
use super::check::Answer;
use crate::request::LimitRequest;

/// The capacity of the counter that holds what Envoy-counted usage adds beyond a limit: far
/// beyond any real count, and exact in every store (a double holds it).
const OVER_CAPACITY: u64 = 1 << 40;

/// How many times a report that did not fit is tried again when concurrent requests keep
/// taking the room it would fill.
const MAX_REPORT_ROUNDS: usize = 8;

impl Limiter {
    /// The answer to `c`, a check whose usage is reported Envoy's way, `over` the policy of the
    /// counter beside it ([`reported_beyond`]).
    pub(super) async fn check_envoy_hits(&self, c: &MatchedCheck, over: Policy) -> Answer {
        let beyond_key = over_key(&c.key);
        let on_error = |_| c.rule.on_store_error;
        if c.cost == 0 {
            // A counter that holds nothing is full, so the store gives it no reset; Envoy gives
            // the rest of the window. A window of the same grid that admits nothing tells it:
            // its refusal carries the time until its window ends. Asked with a cost of 0, on a
            // key of its own that nothing ever writes, it changes no state in any store.
            let edge = c
                .rule
                .policy
                .envoy_overflow(0)
                .unwrap_or_else(|| over.clone());
            let edge_key = window_key(&c.key);
            let batch = [
                Check::new(&c.key, &c.rule.policy, 0),
                Check::new(&beyond_key, &over, 0),
                Check::new(&edge_key, &edge, 0),
            ];
            let (ds, store_failed) = self.check_batch(&batch, on_error).await;
            let (mut d, beyond) = (ds[0], OVER_CAPACITY.saturating_sub(ds[1].remaining));
            if !store_failed {
                d.allowed = beyond == 0;
                d.reset_after = ds[2].reset_after;
                // Over, it passes again when the window ends and both counters with it.
                d.retry_after = d.reset_after;
            }
            if d.allowed {
                d.retry_after = Duration::ZERO;
            }
            return Answer {
                decision: d,
                store_failed,
            };
        }
        let first = self.check_one(c).await;
        if first.decision.allowed || first.store_failed {
            return first;
        }
        let mut room = first.decision.remaining;
        for _ in 0..MAX_REPORT_ROUNDS {
            let fits = room.min(c.cost);
            let pair = [
                Check::new(&c.key, &c.rule.policy, fits),
                Check::new(&beyond_key, &over, c.cost - fits),
            ];
            let batch = if fits > 0 { &pair[..] } else { &pair[1..] };
            let (ds, store_failed) = self.check_batch(batch, on_error).await;
            if store_failed || ds.iter().all(|d| d.allowed) {
                let mut decision = first.decision;
                decision.remaining = 0;
                return Answer {
                    decision,
                    store_failed,
                };
            }
            room = ds[0].remaining;
        }
        first
    }
}

/// The policy of the counter beside planned check `c` that holds the usage reported beyond its
/// limit, when `c` counts Envoy's `hits_addend` Envoy's way: an enforced Envoy-style limit (a
/// fixed window aligned on the clock, as every limit of Envoy's format is) of a descriptor that
/// sent one. That counter has the same windows, [`OVER_CAPACITY`] wide. `None` when `c` counts
/// Sluice's way.
pub(super) fn reported_beyond(request: &LimitRequest, c: &MatchedCheck) -> Option<Policy> {
    if !c.rule.mode.enforces() || !request.descriptors[c.descriptor].envoy_hits {
        return None;
    }
    c.rule.policy.envoy_overflow(OVER_CAPACITY)
}

/// The key of the counter that holds what Envoy-counted usage adds beyond the limit of `key`:
/// in the same Cluster slot, as the hash tag is kept.
pub(super) fn over_key(key: &str) -> String {
    format!("{key}:over")
}

/// The key a check with 0 asks about the end of `key`'s window: never written (it is only
/// asked with a cost of 0), in the same Cluster slot.
fn window_key(key: &str) -> String {
    format!("{key}:window")
}
