//! Policies and costs as script arguments.
//!
//! Each check takes seven arguments: algorithm code, cost, four parameters and a refund token.
//!
//! | algorithm | p1 | p2 | p3 | p4 |
//! |---|---|---|---|---|
//! | token bucket | capacity | refill amount | refill period (ns) | |
//! | GCRA | burst | emission interval (ns) | | |
//! | queue | capacity | release interval (ns) | maximum wait (ns) | 1 if the rate is 0 |
//! | fixed window | limit | window (ns) | 1 if clock-aligned | a window start near now |
//! | sliding log | limit | window (ns) | | |
//! | sliding counter | limit | window (ns) | | a window start near now |
//! | bucketed window | limit | bucket (ns) | buckets in the window | a bucket start near now |
//!
//! The algorithm code is [`code`] of the policy's algorithm.
//!
//! The refill rate is reduced to lowest terms first, which keeps the script's products small
//! without changing a single result. Clock-aligned windows are placed by the script on the grid
//! through a reference window start computed here from the application's clock: any window start
//! on the grid will do, so a skewed application clock moves nothing, and the script's arithmetic
//! stays relative to now, where it is exact.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_core::{Alignment, Policy, StoreError, Timestamp};

use super::algorithm::code;
use super::exact::{EXACT, check_exact};

/// How many script arguments one check takes.
pub(crate) const ARGS_PER_CHECK: usize = 7;

/// Appends the seven arguments of one check to `args`. `token` is the refund token (empty for a
/// check). A policy the script cannot hold exactly is refused here too, not rounded.
pub(crate) fn push_check(
    args: &mut Vec<String>,
    policy: &Policy,
    cost: u64,
    now: Timestamp,
    token: &str,
) -> Result<(), StoreError> {
    check_exact(policy).map_err(StoreError::Rejected)?;
    // Every limit is below EXACT, so a larger cost is refused as permanently as the real one.
    let cost = cost.min(EXACT);
    let p: [String; 4] = match policy {
        Policy::TokenBucket(tb) => {
            let (amount, per) = reduced(tb.rate().amount(), tb.rate().per());
            [
                tb.capacity().to_string(),
                amount.to_string(),
                per.to_string(),
                String::new(),
            ]
        }
        Policy::Gcra(g) => [
            g.burst().to_string(),
            nanos_of(g.emission_interval()).to_string(),
            String::new(),
            String::new(),
        ],
        Policy::LeakyQueue(q) => [
            q.capacity().to_string(),
            nanos_of(q.release_interval()).to_string(),
            // A wait beyond the exact range is as good as unbounded.
            nanos_of(q.max_wait()).min(EXACT - 1).to_string(),
            u8::from(q.rate().amount() == 0).to_string(),
        ],
        Policy::FixedWindow(fw) => {
            let (aligned, reference) = match fw.alignment() {
                Alignment::Clock { .. } => (1, fw.window_start(Timestamp::EPOCH, now)),
                Alignment::FirstRequest => (0, Timestamp::EPOCH),
            };
            [
                fw.limit().to_string(),
                nanos_of(fw.window()).to_string(),
                aligned.to_string(),
                reference.as_nanos().to_string(),
            ]
        }
        Policy::SlidingLog(sl) => [
            sl.limit().to_string(),
            nanos_of(sl.window()).to_string(),
            String::new(),
            String::new(),
        ],
        Policy::SlidingCounter(sc) => {
            let window = nanos_of(sc.window());
            let n = now.as_nanos();
            [
                sc.limit().to_string(),
                window.to_string(),
                String::new(),
                (n - n % window).to_string(),
            ]
        }
        Policy::BucketedWindow(bw) => {
            let bucket = nanos_of(bw.bucket());
            let n = now.as_nanos();
            [
                bw.limit().to_string(),
                bucket.to_string(),
                bw.sub_windows().to_string(),
                (n - n % bucket).to_string(),
            ]
        }
    };
    args.push(code(policy.algorithm()).to_string());
    args.push(cost.to_string());
    args.extend(p);
    args.push(token.to_owned());
    Ok(())
}

/// The application's idea of now, shifted by the store's offset. Used only to pick a reference
/// window start, so its accuracy does not matter: any start on the grid will do, while the skew
/// stays well inside the exact range (104 days, or 417 for a long fixed window).
pub fn app_now(offset_nanos: i64) -> Timestamp {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos();
    let shifted = i128::try_from(wall).unwrap_or(i128::MAX) + i128::from(offset_nanos);
    Timestamp::from_nanos(u64::try_from(shifted.max(0)).unwrap_or(u64::MAX))
}

/// A rate of `amount` per `per` in lowest terms, `per` in nanoseconds.
pub(super) fn reduced(amount: u64, per: Duration) -> (u64, u64) {
    let per = nanos_of(per);
    match gcd(amount, per) {
        0 => (amount, per),
        g => (amount / g, per / g),
    }
}

/// The nanoseconds of a length that [`check_exact`] has accepted.
fn nanos_of(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{Rate, SlidingLog, TokenBucket};

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn every_call_refuses_what_loading_refuses() {
        let p = Policy::from(SlidingLog::new(10, 200 * DAY).unwrap());
        let mut args = Vec::new();
        let err = push_check(&mut args, &p, 1, Timestamp::from_secs(1), "").unwrap_err();
        assert_eq!(err, StoreError::Rejected(check_exact(&p).unwrap_err()));
        assert!(args.is_empty());
    }

    #[test]
    fn rates_are_reduced_to_lowest_terms() {
        assert_eq!(reduced(10, Duration::from_secs(1)), (1, 100_000_000));
        assert_eq!(reduced(3, Duration::from_secs(1)), (3, 1_000_000_000));
        assert_eq!(reduced(0, Duration::from_secs(1)), (0, 1));
    }

    #[test]
    fn huge_costs_stay_permanent_denials() {
        let p = Policy::from(TokenBucket::new(5, Rate::per_second(1)).unwrap());
        let mut args = Vec::new();
        push_check(&mut args, &p, u64::MAX, Timestamp::from_secs(1), "").unwrap();
        assert_eq!(args.len(), ARGS_PER_CHECK);
        assert_eq!(args[1], EXACT.to_string());
    }
}
