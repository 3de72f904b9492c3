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
pub(crate) fn charge(
    policy: &Policy,
    stored: Option<&mut State>,
    units: u64,
    now: Timestamp,
) -> Option<State> {
    state::charge(policy, stored, units, now)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::memory::state::{Meta, decide};
    use crate::{FixedWindow, Rate, SlidingLog, TokenBucket};

    const MINUTE: Duration = Duration::from_secs(60);

    fn at(secs: u64) -> Timestamp {
        Timestamp::from_secs(secs)
    }

    /// What a check at `now` would be told remains of `stored` under `policy`.
    fn remaining(policy: &Policy, stored: &State, now: Timestamp) -> u64 {
        decide(policy, Some(stored), now, 0).1.remaining
    }

    #[test]
    fn a_refund_reaches_the_stored_state_and_keeps_its_meta() {
        let policy: Policy = SlidingLog::new(5, MINUTE).unwrap().into();
        let meta = Meta {
            expires: 7,
            limited: true,
        };
        let mut stored = charge(&policy, None, 5, at(60)).unwrap();
        *stored.meta_mut() = meta;
        assert_eq!(remaining(&policy, &stored, at(60)), 0);
        refund(&policy, &mut stored, 3, at(60), at(61));
        assert_eq!(remaining(&policy, &stored, at(61)), 3);
        assert_eq!(stored.meta(), meta);
    }

    #[test]
    fn a_refund_leaves_a_state_of_another_algorithm_alone() {
        let bucket: Policy = TokenBucket::new(5, Rate::per_minute(5)).unwrap().into();
        let window: Policy = FixedWindow::new(5, MINUTE, crate::Alignment::FirstRequest)
            .unwrap()
            .into();
        let mut stored = charge(&window, None, 4, at(60)).unwrap();
        let before = stored.clone();
        refund(&bucket, &mut stored, 4, at(60), at(60));
        assert_eq!(stored, before);
    }

    #[test]
    fn a_charge_replaces_a_missing_or_foreign_state_and_updates_its_own_in_place() {
        let bucket: Policy = TokenBucket::new(5, Rate::per_minute(5)).unwrap().into();
        let window: Policy = FixedWindow::new(5, MINUTE, crate::Alignment::FirstRequest)
            .unwrap()
            .into();
        // None: a fresh bucket charged 7 is 2 in debt, so nothing remains.
        let mut stored = charge(&bucket, None, 7, at(60)).unwrap();
        assert_eq!(remaining(&bucket, &stored, at(60)), 0);
        // Its own state: charged in place.
        assert!(charge(&bucket, Some(&mut stored), 0, at(60)).is_none());
        // Another algorithm's: a fresh window charged 2.
        let fresh = charge(&window, Some(&mut stored), 2, at(60)).unwrap();
        assert_eq!(remaining(&window, &fresh, at(60)), 3);
    }
}
