//! One key's local state: the core algorithm's own state on this instance's clock, rebuilt from
//! the global state after each sync, with the units admitted since laid on top; and each
//! algorithm's part of the sync's wire (its policy's arguments, its reply), so that everything
//! the hybrid store knows of an algorithm is here.

use std::time::Duration;

use sluice_core::{
    Algorithm, Alignment, Decision, FixedWindow, FixedWindowState, Gcra, Policy, Rate,
    SlidingCounter, SlidingCounterState, Timestamp, TokenBucket, TokenBucketState,
};

use crate::sync::{Floor, GlobalState};

/// A counter's state in the form the core algorithms decide on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Local {
    TokenBucket(TokenBucketState),
    Gcra(Timestamp),
    FixedWindow(FixedWindowState),
    SlidingCounter(SlidingCounterState),
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn ceil_mul_div(a: u64, b: u64, c: u64) -> u64 {
    let c = u128::from(c.max(1));
    let p = u128::from(a) * u128::from(b);
    u64::try_from(p.div_ceil(c)).unwrap_or(u64::MAX)
}

/// Whether two window ends name the same window of length `window`: within half a window of
/// each other, which absorbs clock differences and latency between instance and Redis.
fn same_window(a: Timestamp, b: Timestamp, window: u64) -> bool {
    a.as_nanos().abs_diff(b.as_nanos()).saturating_mul(2) < window
}

/// Decides a request of `cost` on `state` (none: a fresh key) with the core's pure functions.
/// Returns the state to keep if the request is admitted. `None` for a policy the hybrid store
/// does not hold.
pub(crate) fn decide(
    policy: &Policy,
    state: Option<&Local>,
    now: Timestamp,
    cost: u64,
) -> Option<(Local, Decision)> {
    Some(match policy {
        Policy::TokenBucket(p) => {
            let s = match state {
                Some(Local::TokenBucket(s)) => *s,
                _ => p.initial(now),
            };
            let (s, d) = p.decide(s, now, cost);
            (Local::TokenBucket(s), d)
        }
        Policy::Gcra(p) => {
            let s = match state {
                Some(Local::Gcra(s)) => *s,
                _ => Timestamp::EPOCH,
            };
            let (s, d) = p.decide(s, now, cost);
            (Local::Gcra(s), d)
        }
        Policy::FixedWindow(p) => {
            let s = match state {
                Some(Local::FixedWindow(s)) => *s,
                _ => FixedWindowState::default(),
            };
            let (s, d) = p.decide(s, now, cost);
            (Local::FixedWindow(s), d)
        }
        Policy::SlidingCounter(p) => {
            let s = match state {
                Some(Local::SlidingCounter(s)) => *s,
                _ => SlidingCounterState::default(),
            };
            let (s, d) = p.decide(s, now, cost);
            (Local::SlidingCounter(s), d)
        }
        // The algorithm table refuses the others for the hybrid store.
        _ => return None,
    })
}

/// The end of the window `state` counts in, for the windowed algorithms; the epoch otherwise.
pub(crate) fn window_end(policy: &Policy, state: &Local) -> Timestamp {
    match (policy, state) {
        (Policy::FixedWindow(p), Local::FixedWindow(s)) => s.start.saturating_add(p.window()),
        (Policy::SlidingCounter(p), Local::SlidingCounter(s)) => s.start.saturating_add(p.window()),
        _ => Timestamp::EPOCH,
    }
}

/// The local state that `global`, read at `now`, describes.
pub(crate) fn from_global(
    policy: &Policy,
    global: GlobalState,
    current: Option<&Local>,
    now: Timestamp,
) -> Option<Local> {
    match (policy, global) {
        (Policy::FixedWindow(p), GlobalState::Window { count, to_end }) => {
            let window = nanos(p.window());
            if count == 0 || to_end.is_zero() {
                return Some(Local::FixedWindow(FixedWindowState::default()));
            }
            let end = now.saturating_add(to_end);
            // On clock-aligned windows the core finds the window on this clock: keep its start,
            // so that a Redis clock a little ahead does not read as a window of its own.
            let local_start = match p.alignment() {
                Alignment::Clock { .. } => p.window_start(Timestamp::EPOCH, now),
                Alignment::FirstRequest => {
                    Timestamp::from_nanos(end.as_nanos().saturating_sub(window))
                }
            };
            let local_end = local_start.saturating_add(p.window());
            if same_window(end, local_end, window) {
                Some(Local::FixedWindow(FixedWindowState {
                    start: local_start,
                    count,
                }))
            } else {
                // Redis and this clock are in different windows: keep what this instance knows.
                current.copied()
            }
        }
        (
            Policy::SlidingCounter(p),
            GlobalState::Sliding {
                current: cur,
                previous,
                to_end,
            },
        ) => {
            let window = nanos(p.window());
            let n = now.as_nanos();
            let start = Timestamp::from_nanos(n - n % window);
            let end = now.saturating_add(to_end);
            let fit = |current: u64, previous: u64| {
                Some(Local::SlidingCounter(SlidingCounterState {
                    start,
                    current: u32::try_from(current).unwrap_or(u32::MAX),
                    previous: u32::try_from(previous).unwrap_or(u32::MAX),
                }))
            };
            if same_window(end, start.saturating_add(p.window()), window) {
                fit(cur, previous)
            } else if same_window(end, start, window) {
                // Redis has not yet rolled into this clock's window.
                fit(0, cur)
            } else {
                current.copied()
            }
        }
        (Policy::TokenBucket(p), GlobalState::Backlog(b)) => {
            let per = nanos(p.rate().per());
            let amount = p.rate().amount().max(1);
            let b = nanos(b);
            let missing = ceil_mul_div(b, amount, per).min(p.capacity());
            // The bucket holds `capacity - missing` whole tokens at `last`, and is full at
            // `now + b`; a backlog past the capacity (debt) puts `last` after now.
            let full_after_last = ceil_mul_div(missing, per, amount);
            let last =
                (i128::from(now.as_nanos()) + i128::from(b) - i128::from(full_after_last)).max(0);
            Some(Local::TokenBucket(TokenBucketState {
                tokens: p.capacity() - missing,
                last: Timestamp::from_nanos(u64::try_from(last).unwrap_or(u64::MAX)),
            }))
        }
        (Policy::Gcra(_), GlobalState::Backlog(b)) => Some(Local::Gcra(now.saturating_add(b))),
        _ => None,
    }
}

/// How long `policy`'s counter takes to go from full use back to none: its window (a sliding
/// counter's previous window weighs for one more, so two), or the time a bucket takes to refill
/// its whole limit.
pub(crate) fn span(policy: &Policy) -> Duration {
    match policy {
        Policy::FixedWindow(p) => p.window(),
        Policy::SlidingCounter(p) => p.window().saturating_mul(2),
        Policy::TokenBucket(p) => {
            let per = nanos(p.rate().per());
            Duration::from_nanos(ceil_mul_div(p.capacity(), per, p.rate().amount().max(1)))
        }
        Policy::Gcra(p) => p
            .emission_interval()
            .saturating_mul(u32::try_from(p.burst()).unwrap_or(u32::MAX)),
        _ => Duration::ZERO,
    }
}

/// Whether `algorithm` is a bucket (token bucket or GCRA), whose units are dated by when they
/// were admitted rather than by a window.
pub(crate) fn is_bucket(algorithm: Algorithm) -> bool {
    matches!(algorithm, Algorithm::TokenBucket | Algorithm::Gcra)
}

/// The sync script's three numbers of `policy` after its code (see `sync.lua`): the window and
/// its alignment with a window start near `now` (the application clock) for the windowed
/// algorithms; the rate's period and amount, or the emission interval, for the buckets. `None`
/// for a policy the hybrid store does not hold.
pub(crate) fn sync_params(policy: &Policy, now: Timestamp) -> Option<(u64, u64, String)> {
    Some(match policy {
        Policy::FixedWindow(p) => {
            let window = nanos(p.window());
            match p.alignment() {
                Alignment::Clock { .. } => (
                    window,
                    0,
                    p.window_start(Timestamp::EPOCH, now).as_nanos().to_string(),
                ),
                Alignment::FirstRequest => (window, 1, "-".to_owned()),
            }
        }
        Policy::SlidingCounter(p) => {
            let window = nanos(p.window());
            let n = now.as_nanos();
            (window, 0, (n - n % window).to_string())
        }
        Policy::TokenBucket(p) => (nanos(p.rate().per()), p.rate().amount().max(1), "-".into()),
        Policy::Gcra(p) => (nanos(p.emission_interval()), 1, "-".to_owned()),
        _ => return None,
    })
}

/// How many integers of the sync script's reply belong to an entry of `policy`.
pub(crate) fn reply_width(policy: &Policy) -> usize {
    match policy {
        Policy::SlidingCounter(_) => 6,
        Policy::FixedWindow(_) => 5,
        _ => 4,
    }
}

/// The global state, the grant and the floor to send back in an entry's integers of the sync
/// script's reply, the first [`reply_width`] of `n`: for each algorithm its state's fields, the
/// grant, then the floor's place on Redis's clock and the key's birth (0: no live window, so no
/// floor). `None` for a policy the hybrid store does not hold.
pub(crate) fn from_reply(
    policy: &Policy,
    n: [i64; 6],
) -> Option<(GlobalState, i64, Option<Floor>)> {
    let dur = |n: i64| Duration::from_nanos(u64::try_from(n).unwrap_or(0));
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let floor = |at_micros: i64, born_millis: i64, first: u64, second: u64| {
        (born_millis > 0).then_some(Floor {
            at_micros,
            born_millis,
            first,
            second,
        })
    };
    Some(match (policy, n) {
        (Policy::FixedWindow(_), [c, e, g, at, born, _]) => (
            GlobalState::Window {
                count: count(c),
                to_end: dur(e),
            },
            g,
            floor(at, born, count(c), 0),
        ),
        (Policy::SlidingCounter(_), [c, p, e, g, at, born]) => (
            GlobalState::Sliding {
                current: count(c),
                previous: count(p),
                to_end: dur(e),
            },
            g,
            floor(at, born, count(c), count(p)),
        ),
        (Policy::TokenBucket(_) | Policy::Gcra(_), [b, g, at, born, _, _]) => {
            (GlobalState::Backlog(dur(b)), g, floor(at, born, 0, 0))
        }
        _ => return None,
    })
}

/// `state` with `units` more admitted at `now`, counted in the window ending at `end`: what
/// this instance admitted while a sync was on its way, laid over the state the sync returned.
pub(crate) fn add_units(
    policy: &Policy,
    state: &mut Local,
    end: Timestamp,
    units: u64,
    now: Timestamp,
) {
    match (policy, state) {
        (Policy::FixedWindow(p), Local::FixedWindow(s)) => {
            let window = nanos(p.window());
            if s.count == 0 {
                s.start = Timestamp::from_nanos(end.as_nanos().saturating_sub(window));
                s.count = units;
            } else if same_window(s.start.saturating_add(p.window()), end, window) {
                s.count = s.count.saturating_add(units);
            }
        }
        (Policy::SlidingCounter(p), Local::SlidingCounter(s)) => {
            let window = nanos(p.window());
            let units = u32::try_from(units).unwrap_or(u32::MAX);
            if same_window(s.start.saturating_add(p.window()), end, window) {
                s.current = s.current.saturating_add(units);
            } else if same_window(s.start, end, window) {
                s.previous = s.previous.saturating_add(units);
            }
        }
        (Policy::TokenBucket(p), Local::TokenBucket(s)) => {
            let deficit = units.saturating_sub(s.tokens);
            s.tokens = s.tokens.saturating_sub(units);
            if deficit > 0 {
                let per = nanos(p.rate().per());
                let late = ceil_mul_div(deficit, per, p.rate().amount().max(1));
                s.last = s.last.max(now).saturating_add(Duration::from_nanos(late));
            }
        }
        (Policy::Gcra(p), Local::Gcra(tat)) => {
            let at = (*tat).max(now);
            let step = nanos(p.emission_interval()).saturating_mul(units);
            *tat = at.saturating_add(Duration::from_nanos(step));
        }
        _ => {}
    }
}

/// `state` with `units` taken at `taken_at` given back at `now`, as the core algorithm gives
/// them back (`docs/algorithms.md`, "Refunds and charges"): a window only if it is the one they
/// were taken from, a bucket never past its capacity.
pub(crate) fn give_back(
    policy: &Policy,
    state: &mut Local,
    units: u64,
    taken_at: Timestamp,
    now: Timestamp,
) {
    match (policy, state) {
        (Policy::FixedWindow(p), Local::FixedWindow(s)) => {
            *s = p.refund(*s, units, taken_at, now);
        }
        (Policy::SlidingCounter(p), Local::SlidingCounter(s)) => {
            *s = p.refund(*s, units, taken_at, now);
        }
        (Policy::TokenBucket(p), Local::TokenBucket(s)) => {
            *s = p.refund(*s, units, taken_at, now);
        }
        (Policy::Gcra(p), Local::Gcra(tat)) => *tat = p.refund(*tat, units, taken_at, now),
        _ => {}
    }
}

/// Units admitted beyond the limit, as the global state shows them: for the over-admission
/// estimate.
pub(crate) fn over_limit(policy: &Policy, global: GlobalState) -> u64 {
    match (policy, global) {
        (Policy::FixedWindow(p), GlobalState::Window { count, .. }) => {
            count.saturating_sub(p.limit())
        }
        (Policy::SlidingCounter(p), GlobalState::Sliding { current, .. }) => {
            current.saturating_sub(p.limit())
        }
        (Policy::TokenBucket(p), GlobalState::Backlog(b)) => {
            let per = nanos(p.rate().per());
            let amount = p.rate().amount().max(1);
            (u128::from(nanos(b)) * u128::from(amount) / u128::from(per.max(1)))
                .try_into()
                .map_or(u64::MAX, |m: u64| m.saturating_sub(p.capacity()))
        }
        (Policy::Gcra(p), GlobalState::Backlog(b)) => {
            (nanos(b) / nanos(p.emission_interval()).max(1)).saturating_sub(p.burst())
        }
        _ => 0,
    }
}

/// The end of the window of `policy` that holds `now`: for a clock-aligned window or a sliding
/// counter, from the clock; for a window that starts at a key's first request, what
/// `first_request_end` finds in the key's state (`None` when it has no live one); for a bucket,
/// now.
pub(crate) fn current_window_end(
    policy: &Policy,
    now: Timestamp,
    first_request_end: impl FnOnce() -> Option<Timestamp>,
) -> Option<Timestamp> {
    match policy {
        Policy::FixedWindow(p) => match p.alignment() {
            Alignment::Clock { .. } => Some(
                p.window_start(Timestamp::EPOCH, now)
                    .saturating_add(p.window()),
            ),
            Alignment::FirstRequest => first_request_end(),
        },
        Policy::SlidingCounter(p) => {
            let window = u64::try_from(p.window().as_nanos()).unwrap_or(u64::MAX);
            let n = now.as_nanos();
            Some(Timestamp::from_nanos(n - n % window.max(1)).saturating_add(p.window()))
        }
        _ => Some(now),
    }
}

/// A policy the hybrid store holds, as a reservation's record carries it: the algorithm, then
/// the numbers its constructor takes, durations in ns. `None` for a policy the hybrid store does
/// not hold.
pub(crate) fn policy_text(policy: &Policy) -> Option<String> {
    let ns = |d: Duration| d.as_nanos();
    Some(match policy {
        Policy::FixedWindow(p) => match p.alignment() {
            Alignment::Clock { utc_offset_secs } => {
                format!(
                    "fw {} {} c{utc_offset_secs}",
                    policy.limit(),
                    ns(p.window())
                )
            }
            Alignment::FirstRequest => format!("fw {} {} f", policy.limit(), ns(p.window())),
        },
        Policy::SlidingCounter(p) => format!("sc {} {}", policy.limit(), ns(p.window())),
        Policy::TokenBucket(p) => format!(
            "tb {} {} {}",
            p.capacity(),
            p.rate().amount(),
            ns(p.rate().per())
        ),
        Policy::Gcra(p) => format!(
            "gc {} {} {}",
            p.burst(),
            p.rate().amount(),
            ns(p.rate().per())
        ),
        _ => return None,
    })
}

/// The policy [`policy_text`] wrote.
pub(crate) fn parse_policy(text: &str) -> Option<Policy> {
    let mut words = text.split(' ');
    let kind = words.next()?;
    let mut number = || words.next()?.parse::<u64>().ok();
    let nanos = Duration::from_nanos;
    Some(match kind {
        "fw" => {
            let (limit, window) = (number()?, nanos(number()?));
            let alignment = match words.next()? {
                "f" => Alignment::FirstRequest,
                c => Alignment::Clock {
                    utc_offset_secs: c.strip_prefix('c')?.parse().ok()?,
                },
            };
            FixedWindow::new(limit, window, alignment).ok()?.into()
        }
        "sc" => SlidingCounter::new(number()?, nanos(number()?))
            .ok()?
            .into(),
        "tb" => {
            let capacity = number()?;
            let rate = Rate::new(number()?, nanos(number()?)).ok()?;
            TokenBucket::new(capacity, rate).ok()?.into()
        }
        "gc" => {
            let burst = number()?;
            let rate = Rate::new(number()?, nanos(number()?)).ok()?;
            Gcra::new(rate, burst).ok()?.into()
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The load-time gate and the decision path agree on every algorithm: a policy the store
    /// says it holds is decided locally, and one it refuses is never reached.
    #[test]
    fn supports_and_decide_agree_on_every_algorithm() {
        let now = Timestamp::from_nanos(1_000_000_000_000);
        for policy in sluice_core::testing::five_per_second() {
            let held = crate::hybrid_supports(&policy).is_ok();
            let decided = decide(&policy, None, now, 1).is_some();
            assert_eq!(held, decided, "{}", policy.algorithm());
        }
    }
}
