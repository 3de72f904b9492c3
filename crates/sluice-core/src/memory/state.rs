//! One counter's state in the memory store, for whichever algorithm its policy uses.

use crate::algorithm::{
    BucketedWindowState, ConcurrencyLimitState, FixedWindowState, SlidingCounterState,
    SlidingLogState, TokenBucketState,
};
use crate::{Decision, Policy, Timestamp};

/// The shard's bookkeeping on a counter: when it expires and whether it is limited.
///
/// It lives inside each variant of [`State`] rather than beside the enum: packed to 5 bytes of
/// alignment 1, it is laid out in the 7 bytes between the variant's tag and its 8-aligned state,
/// so a tracked counter is 24 bytes rather than 32 and a map slot with its fingerprint 40 rather
/// than 48.
#[repr(C, packed)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Meta {
    /// When the counter is back to full, in whole seconds after the store's base time, rounded
    /// up. Past this an entry means the same as no entry, and sweeping may drop it.
    pub(crate) expires: u32,
    /// Whether the last decision on this counter denied a request or left nothing remaining.
    /// Eviction never drops such an entry before it expires.
    pub(crate) limited: bool,
}

/// A counter's state, for whichever algorithm its policy uses, with the shard's [`Meta`]. Every
/// variant but the log, the buckets and the holds holds 16 bytes of state or less, so the enum is
/// 24; those three are boxed because they grow with the limit and with the number of buckets. A state that
/// [`decide`] returns carries a default `Meta`, which the store sets when it stores the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    TokenBucket(Meta, TokenBucketState),
    Gcra(Meta, Timestamp),
    LeakyQueue(Meta, Timestamp),
    FixedWindow(Meta, FixedWindowState),
    SlidingCounter(Meta, SlidingCounterState),
    SlidingLog(Meta, Box<SlidingLogState>),
    BucketedWindow(Meta, Box<BucketedWindowState>),
    ConcurrencyLimit(Meta, Box<ConcurrencyLimitState>),
}

impl State {
    /// The shard's bookkeeping on this counter.
    #[inline(always)]
    pub(crate) fn meta(&self) -> Meta {
        match self {
            State::TokenBucket(m, _)
            | State::Gcra(m, _)
            | State::LeakyQueue(m, _)
            | State::FixedWindow(m, _)
            | State::SlidingCounter(m, _)
            | State::SlidingLog(m, _)
            | State::BucketedWindow(m, _)
            | State::ConcurrencyLimit(m, _) => *m,
        }
    }

    /// Sets the shard's bookkeeping on this counter.
    #[inline(always)]
    pub(crate) fn meta_mut(&mut self) -> &mut Meta {
        match self {
            State::TokenBucket(m, _)
            | State::Gcra(m, _)
            | State::LeakyQueue(m, _)
            | State::FixedWindow(m, _)
            | State::SlidingCounter(m, _)
            | State::SlidingLog(m, _)
            | State::BucketedWindow(m, _)
            | State::ConcurrencyLimit(m, _) => m,
        }
    }
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
                Some(State::TokenBucket(_, s)) => *s,
                _ => p.initial(now),
            };
            let (next, d) = p.decide(state, now, cost);
            (Update::Set(State::TokenBucket(Meta::default(), next)), d)
        }
        (Policy::Gcra(p), s) => {
            let tat = match s {
                Some(State::Gcra(_, t)) => *t,
                _ => Timestamp::EPOCH,
            };
            let (next, d) = p.decide(tat, now, cost);
            (Update::Set(State::Gcra(Meta::default(), next)), d)
        }
        (Policy::LeakyQueue(p), s) => {
            let next_slot = match s {
                Some(State::LeakyQueue(_, t)) => *t,
                _ => Timestamp::EPOCH,
            };
            let (next, d) = p.decide(next_slot, now, cost);
            (Update::Set(State::LeakyQueue(Meta::default(), next)), d)
        }
        (Policy::FixedWindow(p), s) => {
            let state = match s {
                Some(State::FixedWindow(_, s)) => *s,
                _ => FixedWindowState::default(),
            };
            let (next, d) = p.decide(state, now, cost);
            (Update::Set(State::FixedWindow(Meta::default(), next)), d)
        }
        (Policy::SlidingCounter(p), s) => {
            let state = match s {
                Some(State::SlidingCounter(_, s)) => *s,
                _ => SlidingCounterState::default(),
            };
            let (next, d) = p.decide(state, now, cost);
            (Update::Set(State::SlidingCounter(Meta::default(), next)), d)
        }
        (Policy::SlidingLog(p), Some(State::SlidingLog(_, log))) => {
            (Update::Record(cost), p.decide(log, now, cost))
        }
        (Policy::SlidingLog(p), _) => (
            Update::Record(cost),
            p.decide(&SlidingLogState::default(), now, cost),
        ),
        (Policy::BucketedWindow(p), Some(State::BucketedWindow(_, b))) => {
            (Update::Record(cost), p.decide(b, now, cost))
        }
        (Policy::BucketedWindow(p), _) => (
            Update::Record(cost),
            p.decide(&BucketedWindowState::default(), now, cost),
        ),
        (Policy::ConcurrencyLimit(p), Some(State::ConcurrencyLimit(_, h))) => {
            (Update::Record(cost), p.decide(h, now, cost))
        }
        (Policy::ConcurrencyLimit(p), _) => (
            Update::Record(cost),
            p.decide(&ConcurrencyLimitState::default(), now, cost),
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
        (Policy::TokenBucket(p), State::TokenBucket(_, s)) => {
            step(s, cost, |s| p.decide(s, now, cost))
        }
        (Policy::Gcra(p), State::Gcra(_, t)) => step(t, cost, |t| p.decide(t, now, cost)),
        (Policy::LeakyQueue(p), State::LeakyQueue(_, t)) => {
            step(t, cost, |t| p.decide(t, now, cost))
        }
        (Policy::FixedWindow(p), State::FixedWindow(_, s)) => {
            step(s, cost, |s| p.decide(s, now, cost))
        }
        (Policy::SlidingCounter(p), State::SlidingCounter(_, s)) => {
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
            let meta = stored.meta();
            *stored = fresh;
            *stored.meta_mut() = meta;
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
        (Update::Record(cost), Some(State::SlidingLog(_, log)), Policy::SlidingLog(p)) => {
            p.record(log, now, cost);
            None
        }
        (Update::Record(cost), _, Policy::SlidingLog(p)) => {
            let mut log = Box::<SlidingLogState>::default();
            p.record(&mut log, now, cost);
            Some(State::SlidingLog(Meta::default(), log))
        }
        (Update::Record(cost), Some(State::BucketedWindow(_, b)), Policy::BucketedWindow(p)) => {
            p.record(b, now, cost);
            None
        }
        (Update::Record(cost), _, Policy::BucketedWindow(p)) => {
            let mut b = Box::<BucketedWindowState>::default();
            p.record(&mut b, now, cost);
            Some(State::BucketedWindow(Meta::default(), b))
        }
        (
            Update::Record(cost),
            Some(State::ConcurrencyLimit(_, h)),
            Policy::ConcurrencyLimit(p),
        ) => {
            p.record(h, now, cost);
            None
        }
        (Update::Record(cost), _, Policy::ConcurrencyLimit(p)) => {
            let mut h = Box::<ConcurrencyLimitState>::default();
            p.record(&mut h, now, cost);
            Some(State::ConcurrencyLimit(Meta::default(), h))
        }
        (Update::Record(_), _, _) => None,
    }
}

/// Gives `units` back to a stored counter at `now`, by its algorithm's own refund: see
/// [`super::adjust::refund`]. A state of another algorithm is left alone: it took nothing under
/// this policy, and the next check replaces it.
pub(crate) fn refund(
    policy: &Policy,
    stored: &mut State,
    units: u64,
    taken_at: Timestamp,
    now: Timestamp,
) {
    match (policy, stored) {
        (Policy::TokenBucket(p), State::TokenBucket(_, s)) => {
            *s = p.refund(*s, units, taken_at, now);
        }
        (Policy::Gcra(p), State::Gcra(_, t)) => *t = p.refund(*t, units, taken_at, now),
        (Policy::LeakyQueue(p), State::LeakyQueue(_, t)) => {
            *t = p.refund(*t, units, taken_at, now);
        }
        (Policy::FixedWindow(p), State::FixedWindow(_, s)) => {
            *s = p.refund(*s, units, taken_at, now);
        }
        (Policy::SlidingCounter(p), State::SlidingCounter(_, s)) => {
            *s = p.refund(*s, units, taken_at, now);
        }
        (Policy::SlidingLog(p), State::SlidingLog(_, log)) => {
            p.refund(log, units, taken_at, now);
        }
        (Policy::BucketedWindow(p), State::BucketedWindow(_, b)) => {
            p.refund(b, units, taken_at, now);
        }
        (Policy::ConcurrencyLimit(p), State::ConcurrencyLimit(_, h)) => {
            p.refund(h, units, taken_at, now)
        }
        _ => {}
    }
}

/// Takes `units` from a counter at `now` by its algorithm's own charge: see
/// [`super::adjust::charge`]. Updates `stored` in place and returns `None`, or returns a fresh
/// state charged when there is none or it is of another algorithm, as [`apply`] does.
pub(crate) fn charge(
    policy: &Policy,
    stored: Option<&mut State>,
    units: u64,
    now: Timestamp,
) -> Option<State> {
    let fresh = Meta::default();
    match (policy, stored) {
        (Policy::TokenBucket(p), Some(State::TokenBucket(_, s))) => {
            *s = p.charge(*s, units, now);
            None
        }
        (Policy::TokenBucket(p), _) => Some(State::TokenBucket(
            fresh,
            p.charge(p.initial(now), units, now),
        )),
        (Policy::Gcra(p), Some(State::Gcra(_, t))) => {
            *t = p.charge(*t, units, now);
            None
        }
        (Policy::Gcra(p), _) => Some(State::Gcra(fresh, p.charge(Timestamp::EPOCH, units, now))),
        (Policy::LeakyQueue(p), Some(State::LeakyQueue(_, t))) => {
            *t = p.charge(*t, units, now);
            None
        }
        (Policy::LeakyQueue(p), _) => Some(State::LeakyQueue(
            fresh,
            p.charge(Timestamp::EPOCH, units, now),
        )),
        (Policy::FixedWindow(p), Some(State::FixedWindow(_, s))) => {
            *s = p.charge(*s, units, now);
            None
        }
        (Policy::FixedWindow(p), _) => Some(State::FixedWindow(
            fresh,
            p.charge(FixedWindowState::default(), units, now),
        )),
        (Policy::SlidingCounter(p), Some(State::SlidingCounter(_, s))) => {
            *s = p.charge(*s, units, now);
            None
        }
        (Policy::SlidingCounter(p), _) => Some(State::SlidingCounter(
            fresh,
            p.charge(SlidingCounterState::default(), units, now),
        )),
        (Policy::SlidingLog(p), Some(State::SlidingLog(_, log))) => {
            p.charge(log, units, now);
            None
        }
        (Policy::SlidingLog(p), _) => {
            let mut log = Box::<SlidingLogState>::default();
            p.charge(&mut log, units, now);
            Some(State::SlidingLog(fresh, log))
        }
        (Policy::BucketedWindow(p), Some(State::BucketedWindow(_, b))) => {
            p.charge(b, units, now);
            None
        }
        (Policy::BucketedWindow(p), _) => {
            let mut b = Box::<BucketedWindowState>::default();
            p.charge(&mut b, units, now);
            Some(State::BucketedWindow(fresh, b))
        }
        (Policy::ConcurrencyLimit(p), Some(State::ConcurrencyLimit(_, h))) => {
            p.charge(h, units, now);
            None
        }
        (Policy::ConcurrencyLimit(p), _) => {
            let mut h = Box::<ConcurrencyLimitState>::default();
            p.charge(&mut h, units, now);
            Some(State::ConcurrencyLimit(fresh, h))
        }
    }
}
