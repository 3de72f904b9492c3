//! Policies and names for tests that count admissions.

use std::time::Duration;

use sluice_core::{
    Alignment, BucketedWindow, ConcurrencyLimit, FixedWindow, Gcra, LeakyQueue, Policy, Rate,
    SlidingCounter, SlidingLog, TokenBucket,
};

/// One policy per algorithm with a limit of 50 that does not refill in the seconds a test runs,
/// so that a count of admissions is exact however slow the machine.
pub fn fifty_per_hour() -> Vec<Policy> {
    let hour = Duration::from_secs(3600);
    let slow = Rate::per_minute(1);
    vec![
        TokenBucket::new(50, slow).map(Policy::from),
        Gcra::new(slow, 50).map(Policy::from),
        LeakyQueue::new(slow, 49, hour).map(Policy::from),
        FixedWindow::new(50, hour, Alignment::FirstRequest).map(Policy::from),
        FixedWindow::new(50, hour, Alignment::Clock { utc_offset_secs: 0 }).map(Policy::from),
        SlidingLog::new(50, hour).map(Policy::from),
        SlidingCounter::new(50, hour).map(Policy::from),
        BucketedWindow::new(50, hour, 60).map(Policy::from),
        ConcurrencyLimit::new(50, hour).map(Policy::from),
    ]
    .into_iter()
    .map(|p| p.expect("valid policy"))
    .collect()
}

/// A name for a policy in assertion messages.
pub fn name(p: &Policy) -> String {
    match p {
        Policy::FixedWindow(fw) => format!("fixed_window {:?}", fw.alignment()),
        p => p.algorithm().to_string(),
    }
}
