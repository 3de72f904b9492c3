//! One counter's state in the memory store, for whichever algorithm its policy uses.

use crate::algorithm::{
    BucketedWindowState, FixedWindowState, SlidingCounterState, SlidingLogState, TokenBucketState,
};
use crate::{Decision, Policy, Timestamp};

/// A counter's state. Every variant but the log and the buckets fits in 16 bytes, so the enum is
/// 24; those two are boxed because they grow with the limit and with the number of buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    TokenBucket(TokenBucketState),
    Gcra(Timestamp),
    LeakyQueue(Timestamp),
    FixedWindow(FixedWindowState),
    SlidingCounter(SlidingCounterState),
    SlidingLog(Box<SlidingLogState>),
    BucketedWindow(Box<BucketedWindowState>),
}

/// What admitting a request does to its counter.
pub(crate) enum Update {
    /// Replace the state with this one.
    Set(State),
    /// Add `cost` units to the stored log or buckets (or fresh ones), so that they are never
    /// copied to decide.
    Record(u64),
}

/// Decides a request of `cost` under `policy`, given the stored state if any. A stored state of
/// another algorithm (the key's policy changed) counts as fresh. Returns the update to apply if
/// the caller admits the request.
pub(crate) fn decide(
    policy: &Policy,
    stored: Option<&State>,
    now: Timestamp,
    cost: u64,
) -> (Update, Decision) {
    match (policy, stored) {
        (Policy::TokenBucket(p), s) => {
            let state = match s {
                Some(State::TokenBucket(s)) => *s,
                _ => p.initial(now),
            };
            let (next, d) = p.decide(state, now, cost);
            (Update::Set(State::TokenBucket(next)), d)
        }
        (Policy::Gcra(p), s) => {
            let tat = match s {
                Some(State::Gcra(t)) => *t,
                _ => Timestamp::EPOCH,
            };
            let (next, d) = p.decide(tat, now, cost);
            (Update::Set(State::Gcra(next)), d)
        }
        (Policy::LeakyQueue(p), s) => {
            let next_slot = match s {
                Some(State::LeakyQueue(t)) => *t,
                _ => Timestamp::EPOCH,
            };
            let (next, d) = p.decide(next_slot, now, cost);
            (Update::Set(State::LeakyQueue(next)), d)
        }
        (Policy::FixedWindow(p), s) => {
            let state = match s {
                Some(State::FixedWindow(s)) => *s,
                _ => FixedWindowState::default(),
            };
            let (next, d) = p.decide(state, now, cost);
            (Update::Set(State::FixedWindow(next)), d)
        }
        (Policy::SlidingCounter(p), s) => {
            let state = match s {
                Some(State::SlidingCounter(s)) => *s,
                _ => SlidingCounterState::default(),
            };
            let (next, d) = p.decide(state, now, cost);
            (Update::Set(State::SlidingCounter(next)), d)
        }
        (Policy::SlidingLog(p), Some(State::SlidingLog(log))) => {
            (Update::Record(cost), p.decide(log, now, cost))
        }
        (Policy::SlidingLog(p), _) => (
            Update::Record(cost),
            p.decide(&SlidingLogState::default(), now, cost),
        ),
        (Policy::BucketedWindow(p), Some(State::BucketedWindow(b))) => {
            (Update::Record(cost), p.decide(b, now, cost))
        }
        (Policy::BucketedWindow(p), _) => (
            Update::Record(cost),
            p.decide(&BucketedWindowState::default(), now, cost),
        ),
    }
}

/// Decides a request against a stored state and, if it admits it at a cost, updates the state
/// in place: [`decide`] then [`apply`] in one step, for one check. The constant-size states are
/// updated where they lie instead of being returned and copied back, which is most of what a
/// decision on a hot key costs besides the clock, the fingerprint and the lock.
#[inline(always)]
pub(crate) fn decide_in_place(
    policy: &Policy,
    stored: &mut State,
    now: Timestamp,
    cost: u64,
) -> Decision {
    /// Decides with `decide` on a copy of the state, and stores the result if it consumes.
    #[inline(always)]
    fn step<S: Copy>(
        state: &mut S,
        cost: u64,
        decide: impl FnOnce(S) -> (S, Decision),
    ) -> Decision {
        let (next, d) = decide(*state);
        if d.allowed && cost > 0 {
            *state = next;
        }
        d
    }
    match (policy, stored) {
        (Policy::TokenBucket(p), State::TokenBucket(s)) => {
            step(s, cost, |s| p.decide(s, now, cost))
        }
        (Policy::Gcra(p), State::Gcra(t)) => step(t, cost, |t| p.decide(t, now, cost)),
        (Policy::LeakyQueue(p), State::LeakyQueue(t)) => step(t, cost, |t| p.decide(t, now, cost)),
        (Policy::FixedWindow(p), State::FixedWindow(s)) => {
            step(s, cost, |s| p.decide(s, now, cost))
        }
        (Policy::SlidingCounter(p), State::SlidingCounter(s)) => {
            step(s, cost, |s| p.decide(s, now, cost))
        }
        (policy, stored) => decide_then_apply(policy, stored, now, cost),
    }
}

/// [`decide_in_place`] for the logs and buckets, which record in place already, and for a
/// state of another algorithm (the key's policy changed), which is replaced. Kept out of line
/// so that the constant-size cases stay small enough to inline.
#[inline(never)]
fn decide_then_apply(policy: &Policy, stored: &mut State, now: Timestamp, cost: u64) -> Decision {
    let (update, d) = decide(policy, Some(stored), now, cost);
    if d.allowed && cost > 0 {
        if let Some(fresh) = apply(policy, Some(stored), update, now) {
            *stored = fresh;
        }
    }
    d
}

/// Applies an admitted request's update to the stored state, if there is one. Returns the state
/// to store in its place when there is none, or when the stored one is of another algorithm.
pub(crate) fn apply(
    policy: &Policy,
    stored: Option<&mut State>,
    update: Update,
    now: Timestamp,
) -> Option<State> {
    match (update, stored, policy) {
        (Update::Set(state), _, _) => Some(state),
        (Update::Record(cost), Some(State::SlidingLog(log)), Policy::SlidingLog(p)) => {
            p.record(log, now, cost);
            None
        }
        (Update::Record(cost), _, Policy::SlidingLog(p)) => {
            let mut log = Box::<SlidingLogState>::default();
            p.record(&mut log, now, cost);
            Some(State::SlidingLog(log))
        }
        (Update::Record(cost), Some(State::BucketedWindow(b)), Policy::BucketedWindow(p)) => {
            p.record(b, now, cost);
            None
        }
        (Update::Record(cost), _, Policy::BucketedWindow(p)) => {
            let mut b = Box::<BucketedWindowState>::default();
            p.record(&mut b, now, cost);
            Some(State::BucketedWindow(b))
        }
        (Update::Record(_), _, _) => None,
    }
}
