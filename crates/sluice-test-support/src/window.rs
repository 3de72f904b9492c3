//! Counters whose windows are aligned to the clock, checked on the real clock. Envoy's `unit:`
//! limits start their windows on multiples of the unit since the epoch (and a sliding counter's
//! do, whatever its length), so however long the unit, one can end between two checks of a
//! test: a day ends at midnight UTC whenever the test happens to run then.
//!
//! A test that is not about that alignment gives its limits `alignment: first_request` instead.
//! One that must keep Envoy's format records its answers in a [`LatestWindow`], and states what
//! one window answers; one that counts a burst checks with [`clock_window`] that the burst fell
//! in one window.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The answers about one counter in its latest window.
///
/// Within one window the time until the reset only shrinks, and once the counter holds anything
/// it stays above zero until the window ends (a counter that holds nothing resets in no time).
/// So an answer is the first of a new window when its reset is later than that of the answer
/// before it, or zero after one that was not, and the answers of the window before are dropped;
/// after a counter that held nothing, any reset may follow. A test asks until the latest window
/// holds as many answers as it states what one window answers, and then holds them to that: a
/// window that ends during the test costs asking again in the next one, and a counter that
/// admits too much in one window still fails, since its reset does not move later.
#[derive(Debug)]
pub struct LatestWindow<T> {
    answers: Vec<T>,
    last_reset: Option<Duration>,
    windows: usize,
}

impl<T> Default for LatestWindow<T> {
    fn default() -> Self {
        LatestWindow {
            answers: Vec::new(),
            last_reset: None,
            windows: 1,
        }
    }
}

impl<T> LatestWindow<T> {
    /// No answers yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `answer`, given with the time until its counter's window resets.
    ///
    /// Panics if a second window ends: the tests that use this check for seconds, on units of a
    /// day or longer.
    pub fn push(&mut self, answer: T, reset: Duration) {
        let new_window = self
            .last_reset
            .is_some_and(|last| !last.is_zero() && (reset > last || reset.is_zero()));
        if new_window {
            assert_eq!(
                self.windows, 1,
                "a second window ended within one test (the reset went from {:?} to {reset:?})",
                self.last_reset
            );
            self.windows += 1;
            self.answers.clear();
        }
        self.last_reset = Some(reset);
        self.answers.push(answer);
    }

    /// The answers of the latest window, in the order they came.
    pub fn answers(&self) -> &[T] {
        &self.answers
    }

    /// How many answers the latest window holds.
    pub fn len(&self) -> usize {
        self.answers.len()
    }

    /// Whether the latest window holds no answer yet.
    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }

    /// How many windows the answers fell in: 1, or 2 when one ended during the test.
    pub fn windows(&self) -> usize {
        self.windows
    }
}

/// Which window of length `window`, counted from the epoch, this machine's clock is in now. The
/// `sluice` processes and `redis-server` under test read the same clock, so a burst that starts
/// and ends in the same window by it was decided in one window of theirs.
pub fn clock_window(window: Duration) -> u128 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970");
    now.as_nanos() / window.as_nanos()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn answers_of_one_window_are_all_kept() {
        let mut w = LatestWindow::new();
        for (i, reset) in [secs(0), secs(50), secs(50), secs(49), secs(1)]
            .into_iter()
            .enumerate()
        {
            w.push(i, reset);
        }
        assert_eq!(w.answers(), [0, 1, 2, 3, 4]);
        assert_eq!(w.windows(), 1);
    }

    #[test]
    fn a_later_reset_or_an_emptied_counter_starts_the_next_window() {
        let mut w = LatestWindow::new();
        w.push("a", secs(2));
        w.push("b", secs(1));
        w.push("c", DAY);
        w.push("d", DAY - secs(1));
        assert_eq!(w.answers(), ["c", "d"]);
        assert_eq!(w.windows(), 2);

        let mut w = LatestWindow::new();
        w.push("a", secs(1));
        w.push("b", secs(0));
        w.push("c", DAY);
        assert_eq!(w.answers(), ["b", "c"]);
        assert_eq!(w.windows(), 2);
    }

    #[test]
    #[should_panic(expected = "a second window ended")]
    fn a_second_window_is_refused() {
        let mut w = LatestWindow::new();
        w.push((), secs(1));
        w.push((), DAY);
        w.push((), DAY);
        w.push((), DAY + secs(1));
    }

    #[test]
    fn clock_windows_count_from_the_epoch() {
        let days = clock_window(DAY);
        let seconds = clock_window(secs(1));
        assert!(seconds > 1_700_000_000, "{seconds}");
        // The same day, or the next one if midnight came between the two readings.
        assert!(
            [days, days + 1].contains(&(seconds / 86_400)),
            "{days} {seconds}"
        );
    }
}
