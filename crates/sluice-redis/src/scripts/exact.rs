//! What the scripts hold exactly: Redis runs Lua 5.1, whose numbers are doubles, so every number
//! a script sees must stay below 2⁵³ (see the `scripts` module's "Numbers in Lua"). A policy with
//! a larger number is refused, with what to do instead, never rounded.

use std::time::Duration;

use sluice_core::{Magnitude, Policy, Rate};

/// The largest integer Lua (doubles) holds exactly: every number a script sees stays below it.
pub(crate) const EXACT: u64 = 1 << 53;

/// The longest fixed window the script holds exactly: 2⁵⁵ ns, about 417 days, for windows that
/// are whole microseconds (see [`exact_long_window`]). The script's numbers reach the window
/// plus the application clock's skew, and stay below 2⁵⁶ while the skew is under 417 days.
const LONG_WINDOW: u64 = 1 << 55;

/// Why the redis store cannot hold a longer fixed window, for messages.
const LONG_WINDOW_SPAN: &str =
    "about 417 days: its scripts compute in Lua doubles, exact below 2^55 ns in whole microseconds";

/// Why the redis store cannot hold a length, for messages.
const EXACT_SPAN: &str = "about 104 days: its scripts compute in Lua doubles, exact below 2^53 ns";

/// Checks that the check script can hold every number of `policy` exactly, or says which one it
/// cannot and what to do instead. This is the one statement of what the redis store can hold:
/// [`push_check`](super::args::push_check) checks it before every call, and
/// [`supports`](crate::supports) (what `Store::supports` answers) once per rule when rules load,
/// so that such a rule is refused then rather than failing each request.
pub(crate) fn check_exact(policy: &Policy) -> Result<(), String> {
    for number in policy.magnitudes() {
        match number {
            Magnitude::Count(what, value) => exact(what, value)?,
            Magnitude::Length(what, length) => {
                exact_nanos(what, length)?;
            }
            Magnitude::LongWindow(window) => exact_long_window(window)?,
            Magnitude::Backlog(what, count, interval) => {
                exact_backlog(
                    what,
                    count,
                    u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX),
                )?;
            }
            Magnitude::Rate(rate) => exact_rate(rate)?,
        }
    }
    Ok(())
}

/// Refuses a count the script cannot hold exactly, naming it.
fn exact(what: &str, value: u64) -> Result<(), String> {
    if value < EXACT {
        Ok(())
    } else {
        Err(format!(
            "the {what} of {value} is more than the redis store can hold (below 2^53: its \
             scripts compute in Lua doubles); lower it, or use the memory store"
        ))
    }
}

/// A length in nanoseconds that the script can hold exactly, or a refusal naming it.
fn exact_nanos(what: &str, d: Duration) -> Result<u64, String> {
    match u64::try_from(d.as_nanos()) {
        Ok(n) if n < EXACT => Ok(n),
        _ => Err(format!(
            "the {what} of {} is longer than the redis store can hold ({EXACT_SPAN}); shorten \
             it, or use the memory store",
            days(d.as_nanos())
        )),
    }
}

/// A backlog of `count` intervals of `interval` ns that the script can hold exactly, or a
/// refusal. GCRA and the queue store a time up to `count` intervals ahead of now, and compare
/// backlogs with that product: beyond 2⁵³ ns a double would round it.
fn exact_backlog(what: &str, count: u64, interval: u64) -> Result<(), String> {
    let span = u128::from(count) * u128::from(interval);
    if span < u128::from(EXACT) {
        Ok(())
    } else {
        Err(format!(
            "a {what} of {count} takes {} to drain at its rate, longer than the redis store can \
             hold ({EXACT_SPAN}); lower the {what} or raise the rate, or use the memory store",
            days(span)
        ))
    }
}

/// A refill rate whose lowest terms the script can hold exactly, or a refusal.
fn exact_rate(rate: Rate) -> Result<(), String> {
    let (amount, per) = rate.lowest_terms();
    exact("refill amount in lowest terms", amount)?;
    if per < EXACT {
        Ok(())
    } else {
        Err(format!(
            "the refill rate is {amount} per {} in lowest terms, a period longer than the redis \
             store can hold ({EXACT_SPAN}); raise the rate, or use the memory store",
            days(u128::from(per))
        ))
    }
}

/// A fixed window the script can hold exactly, or a refusal. Up to 2⁵³ ns any window is exact.
/// Beyond that a fixed window still is, up to [`LONG_WINDOW`], when it is a whole number of
/// microseconds: Redis `TIME` counts microseconds, so the script's now is a multiple of 8 ns, and
/// so is every number of such a window (its length, its grid, its start, its reset), and a
/// double holds every multiple of 8 below 2⁵⁶ exactly. This takes in Envoy's `unit: year`.
fn exact_long_window(window: Duration) -> Result<(), String> {
    let n = window.as_nanos();
    if n < u128::from(EXACT) {
        return Ok(());
    }
    if n >= u128::from(LONG_WINDOW) {
        return Err(format!(
            "the window of {} is longer than the redis store can hold for a fixed window \
             ({LONG_WINDOW_SPAN}); shorten it, or use the memory store",
            days(n)
        ));
    }
    if n % 1_000 != 0 {
        return Err(format!(
            "the window of {} is longer than 104 days and not a whole number of microseconds, \
             which the redis store needs of so long a window (its scripts compute in Lua \
             doubles); round it, or use the memory store",
            days(n)
        ));
    }
    Ok(())
}

/// A length of about a day or more, for a message: `200d`, or `104.2 days` when not whole.
fn days(nanos: u128) -> String {
    const DAY: u128 = 86_400 * 1_000_000_000;
    if nanos % DAY == 0 {
        format!("{}d", nanos / DAY)
    } else {
        format!("{:.1} days", nanos as f64 / DAY as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{
        Alignment, BucketedWindow, FixedWindow, Gcra, LeakyQueue, SlidingCounter, SlidingLog,
        TokenBucket,
    };

    const DAY: Duration = Duration::from_secs(86_400);
    /// The longest length the script holds exactly: 2⁵³ - 1 ns, a little over 104 days.
    const LONGEST: Duration = Duration::from_nanos(EXACT - 1);
    /// The largest burst or queue capacity at one per second: 104 days' worth.
    const LARGEST_AT_ONE_PER_SECOND: u64 = (EXACT - 1) / 1_000_000_000;

    fn fixed(w: Duration) -> Policy {
        FixedWindow::new(10, w, Alignment::FirstRequest)
            .unwrap()
            .into()
    }

    fn fixed_on_the_clock(w: Duration) -> Policy {
        let clock = Alignment::Clock { utc_offset_secs: 0 };
        FixedWindow::new(10, w, clock).unwrap().into()
    }

    #[test]
    fn sliding_windows_are_held_up_to_104_days() {
        let windows: [fn(Duration) -> Policy; 3] = [
            |w| SlidingLog::new(10, w).unwrap().into(),
            |w| SlidingCounter::new(10, w).unwrap().into(),
            |w| BucketedWindow::new(10, w, 1).unwrap().into(),
        ];
        for window in windows {
            assert_eq!(check_exact(&window(LONGEST)), Ok(()));
            let err = check_exact(&window(200 * DAY)).unwrap_err();
            assert!(
                err.starts_with(
                    "the window of 200d is longer than the redis store can hold (about 104 days"
                ),
                "{err}"
            );
        }
    }

    #[test]
    fn fixed_windows_are_held_up_to_417_days_in_whole_microseconds() {
        let year = 365 * DAY;
        let longest = Duration::from_micros((LONG_WINDOW - 1) / 1_000);
        for window in [fixed, fixed_on_the_clock] {
            for held in [LONGEST, 200 * DAY, year, longest] {
                assert_eq!(check_exact(&window(held)), Ok(()), "{held:?}");
            }
            let err = check_exact(&window(500 * DAY)).unwrap_err();
            assert!(
                err.starts_with(
                    "the window of 500d is longer than the redis store can hold for a fixed \
                     window (about 417 days"
                ),
                "{err}"
            );
            let err = check_exact(&window(year + Duration::from_nanos(1))).unwrap_err();
            assert!(err.contains("not a whole number of microseconds"), "{err}");
        }
    }

    #[test]
    fn counts_are_held_below_2_pow_53() {
        let bucket =
            |capacity| Policy::from(TokenBucket::new(capacity, Rate::per_second(1)).unwrap());
        assert_eq!(check_exact(&bucket(EXACT - 1)), Ok(()));
        let err = check_exact(&bucket(EXACT)).unwrap_err();
        assert!(
            err.starts_with("the capacity of 9007199254740992 is more than"),
            "{err}"
        );
        let window =
            |limit| Policy::from(FixedWindow::new(limit, DAY, Alignment::FirstRequest).unwrap());
        assert_eq!(check_exact(&window(EXACT - 1)), Ok(()));
        assert!(
            check_exact(&window(EXACT))
                .unwrap_err()
                .contains("the limit of")
        );
    }

    #[test]
    fn token_bucket_rates_are_held_by_their_period_in_lowest_terms() {
        let bucket = |amount, per| {
            Policy::from(TokenBucket::new(10, Rate::new(amount, per).unwrap()).unwrap())
        };
        assert_eq!(check_exact(&bucket(1, 104 * DAY)), Ok(()));
        // 365 a year is one a day, however long the year.
        assert_eq!(check_exact(&bucket(365, 365 * DAY)), Ok(()));
        let err = check_exact(&bucket(1, 200 * DAY)).unwrap_err();
        assert!(
            err.starts_with("the refill rate is 1 per 200d in lowest terms"),
            "{err}"
        );
        let err = check_exact(&bucket(3, 365 * DAY)).unwrap_err();
        assert!(err.contains("1 per 121.7 days"), "{err}");
    }

    #[test]
    fn gcra_is_held_while_its_burst_drains_within_104_days() {
        let gcra = |burst| Policy::from(Gcra::new(Rate::per_second(1), burst).unwrap());
        assert_eq!(check_exact(&gcra(LARGEST_AT_ONE_PER_SECOND)), Ok(()));
        let err = check_exact(&gcra(LARGEST_AT_ONE_PER_SECOND + 1)).unwrap_err();
        assert!(
            err.starts_with("a burst of 9007200 takes 104.2 days to drain at its rate"),
            "{err}"
        );
        // A burst of 0 drains at once, but its emission interval is passed as it is.
        let slow = Rate::new(1, 200 * DAY).unwrap();
        let err = check_exact(&Gcra::new(slow, 0).unwrap().into()).unwrap_err();
        assert!(
            err.starts_with("the emission interval of 200d is longer"),
            "{err}"
        );
    }

    #[test]
    fn a_queue_is_held_while_it_drains_within_104_days() {
        let queue = |rate, size| Policy::from(LeakyQueue::new(rate, size, DAY).unwrap());
        let largest = LARGEST_AT_ONE_PER_SECOND - 1; // the capacity is the size plus one
        assert_eq!(check_exact(&queue(Rate::per_second(1), largest)), Ok(()));
        let err = check_exact(&queue(Rate::per_second(1), largest + 1)).unwrap_err();
        assert!(
            err.starts_with("a queue capacity of 9007200 takes 104.2 days"),
            "{err}"
        );
        // A queue with a rate of 0 admits nothing, so its capacity builds no backlog.
        assert_eq!(
            check_exact(&queue(Rate::per_second(0), largest + 1)),
            Ok(())
        );
    }
}
