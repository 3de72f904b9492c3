//! Changes to a stored counter outside a check: a refund of units taken before, and a charge
//! that takes units whatever the counter holds. Settling a reservation does both; Envoy's
//! `is_negative_hits` refunds.

use super::state::State;
use crate::{Policy, Timestamp};

/// Gives `units` back to a stored counter at `now`, as far as it still holds what was taken at
/// `taken_at` (a window that has ended has nothing to give back), and never past what the
/// counter can hold. A state of another algorithm is left alone.
pub(crate) fn refund(
    policy: &Policy,
    stored: &mut State,
    units: u64,
    taken_at: Timestamp,
    now: Timestamp,
) {
    let _ = (policy, stored, units, taken_at, now);
    unimplemented!("refund")
}

/// Takes `units` from a counter at `now` whatever it holds, past its limit if need be, so that
/// the next request is refused until the excess has drained. Updates `stored` in place and
/// returns `None`, or returns the state to store when there is none or it is of another
/// algorithm.
pub(crate) fn charge(
    policy: &Policy,
    stored: Option<&mut State>,
    units: u64,
    now: Timestamp,
) -> Option<State> {
    let _ = (policy, stored, units, now);
    unimplemented!("charge")
}
