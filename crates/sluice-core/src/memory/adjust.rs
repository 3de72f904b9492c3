//! Changes to a stored counter outside a check: a refund of units taken before, and a charge
//! that takes units whatever the counter holds. Settling a reservation does both; Envoy's
//! `is_negative_hits` refunds.
//!
//! What a refund or a charge does is each algorithm's own (`refund` and `charge` on its policy
//! type; docs/algorithms.md, "Refunds and charges"); which algorithm a stored state belongs to
//! is read where the other per-algorithm steps are, in [`super::state`], so that no further
//! file needs to name every algorithm.

use super::state::{self, State};
use crate::{Policy, Timestamp};

/// Gives `units` back to a stored counter at `now`, as far as it still holds what was taken at
/// `taken_at` (a window that has ended has nothing to give back), and never past what the
/// counter can hold. A state of another algorithm is left alone.
#[allow(dead_code)] // used by the memory store's settle, next
pub(crate) fn refund(
    policy: &Policy,
    stored: &mut State,
    units: u64,
    taken_at: Timestamp,
    now: Timestamp,
) {
    state::refund(policy, stored, units, taken_at, now);
}

/// Takes `units` from a counter at `now` whatever it holds, past its limit if need be, so that
/// the next request is refused until the excess has drained. Updates `stored` in place and
/// returns `None`, or returns the state to store when there is none or it is of another
/// algorithm.
#[allow(dead_code)] // used by the memory store's settle, next
pub(crate) fn charge(
    policy: &Policy,
    stored: Option<&mut State>,
    units: u64,
    now: Timestamp,
) -> Option<State> {
    state::charge(policy, stored, units, now)
}
