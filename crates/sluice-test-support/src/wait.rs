//! Polling until something holds, with a deadline: how tests wait for a server to come up, a
//! process to exit, a replica to catch up or a store to find its server again, without sleeping
//! for a guessed time. No assertion depends on how long the wait took; a wait that runs out
//! fails the test with what it was waiting for.
//!
//! There is one loop for threads ([`wait_within`]) and one for async tests
//! ([`eventually_within`]); [`wait_until`] and [`eventually`] are the same with [`PATIENCE`].

use std::fmt::{self, Display};
use std::future::Future;
use std::time::{Duration, Instant};

/// How long a test waits for anything before it fails: long enough for a debug build on a
/// loaded 2-core machine, short enough that a hang is reported, not waited out by CI.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// How long a poll rests between two attempts.
const TICK: Duration = Duration::from_millis(20);

/// What one attempt of a wait returns: done (with a value), or not yet (with what to say if the
/// time runs out on it).
pub trait Attempt {
    /// What the wait returns once the attempt succeeds.
    type Done;
    /// What the attempt saw when it was not done, quoted if the wait times out.
    type Pending: Display;

    /// `Ok` when done, `Err` with what was seen otherwise.
    fn into_result(self) -> Result<Self::Done, Self::Pending>;
}

/// Nothing to report about an attempt that is not done.
#[derive(Debug, Clone, Copy)]
pub struct NothingSeen;

impl Display for NothingSeen {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ok(())
    }
}

/// A condition: done when it holds.
impl Attempt for bool {
    type Done = ();
    type Pending = NothingSeen;

    fn into_result(self) -> Result<(), NothingSeen> {
        if self { Ok(()) } else { Err(NothingSeen) }
    }
}

/// A value that may not be there yet: done when it is.
impl<T> Attempt for Option<T> {
    type Done = T;
    type Pending = NothingSeen;

    fn into_result(self) -> Result<T, NothingSeen> {
        self.ok_or(NothingSeen)
    }
}

/// A value, or what was seen instead: the last thing seen is quoted if the wait times out.
impl<T, E: Display> Attempt for Result<T, E> {
    type Done = T;
    type Pending = E;

    fn into_result(self) -> Result<T, E> {
        self
    }
}

/// When a wait gives up, and what it says then.
struct Deadline<'a> {
    what: &'a str,
    within: Duration,
    at: Instant,
}

impl<'a> Deadline<'a> {
    fn start(what: &'a str, within: Duration) -> Self {
        Deadline {
            what,
            within,
            at: Instant::now() + within,
        }
    }

    /// Panics, naming the wait and quoting `seen`, once the deadline has passed.
    fn check(&self, seen: &impl Display) {
        if Instant::now() < self.at {
            return;
        }
        let seen = format!("{seen:#}");
        let (what, within) = (self.what, self.within);
        if seen.is_empty() {
            panic!("timed out after {within:?} waiting until {what}");
        }
        panic!("timed out after {within:?} waiting until {what}; the last attempt saw: {seen}");
    }
}

/// Tries `attempt` until it is done and returns what it gave, for at most [`PATIENCE`].
pub fn wait_until<A: Attempt>(what: &str, attempt: impl FnMut() -> A) -> A::Done {
    wait_within(what, PATIENCE, attempt)
}

/// Tries `attempt` every 20 ms until it is done and returns what it gave. Panics with `what`
/// (and what the last attempt saw, if it says) once `within` has passed.
pub fn wait_within<A: Attempt>(
    what: &str,
    within: Duration,
    mut attempt: impl FnMut() -> A,
) -> A::Done {
    let deadline = Deadline::start(what, within);
    loop {
        match attempt().into_result() {
            Ok(done) => return done,
            Err(seen) => deadline.check(&seen),
        }
        std::thread::sleep(TICK);
    }
}

/// [`wait_until`] for async attempts, resting on the test's runtime between them.
pub async fn eventually<A, F, Fut>(what: &str, attempt: F) -> A::Done
where
    A: Attempt,
    F: FnMut() -> Fut,
    Fut: Future<Output = A>,
{
    eventually_within(what, PATIENCE, attempt).await
}

/// [`wait_within`] for async attempts, resting on the test's runtime between them.
pub async fn eventually_within<A, F, Fut>(what: &str, within: Duration, mut attempt: F) -> A::Done
where
    A: Attempt,
    F: FnMut() -> Fut,
    Fut: Future<Output = A>,
{
    let deadline = Deadline::start(what, within);
    loop {
        match attempt().await.into_result() {
            Ok(done) => return done,
            Err(seen) => deadline.check(&seen),
        }
        tokio::time::sleep(TICK).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_returns_what_the_successful_attempt_gave() {
        let mut tries = 0;
        let got = wait_until("the third try", || {
            tries += 1;
            (tries == 3).then_some(tries)
        });
        assert_eq!(got, 3);
    }

    #[test]
    #[should_panic(expected = "waiting until it never holds; the last attempt saw: 7")]
    fn a_wait_that_runs_out_says_what_it_waited_for_and_saw() {
        wait_within("it never holds", Duration::from_millis(50), || {
            Err::<(), _>(7)
        });
    }

    #[tokio::test]
    async fn an_async_wait_returns_once_its_condition_holds() {
        let mut tries = 0;
        eventually("the second try", || {
            tries += 1;
            let done = tries == 2;
            async move { done }
        })
        .await;
        assert_eq!(tries, 2);
    }
}
