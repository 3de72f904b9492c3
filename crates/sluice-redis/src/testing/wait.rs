//! Polling a condition until it holds, with a deadline: how tests wait for servers to come up, and
//! for a store to find a server again.

use std::time::{Duration, Instant};

/// How long a server may take to come up before the test gives up.
const STARTUP: Duration = Duration::from_secs(20);

/// Polls `ready` until it holds, for at most 20 seconds. Waiting for a server to come up is the
/// only waiting the tests do; no assertion depends on how long anything took.
pub fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + STARTUP;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// [`wait_until`] for async conditions, on the test's runtime.
pub async fn eventually<F, Fut>(what: &str, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + STARTUP;
    while !ready().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
