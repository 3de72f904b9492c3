//! Policies and costs as script arguments, and script replies as decisions.
//!
//! Each check takes seven arguments: algorithm code, cost, four parameters and a refund token.
//!
//! | algorithm | code | p1 | p2 | p3 | p4 |
//! |---|---|---|---|---|---|
//! | token bucket | 1 | capacity | refill amount | refill period (ns) | |
//! | GCRA | 2 | burst | emission interval (ns) | | |
//! | queue | 3 | capacity | release interval (ns) | maximum wait (ns) | 1 if the rate is 0 |
//! | fixed window | 4 | limit | window (ns) | 1 if clock-aligned | a window start near now |
//! | sliding log | 5 | limit | window (ns) | | |
//! | sliding counter | 6 | limit | window (ns) | | a window start near now |
//!
//! The refill rate is reduced to lowest terms first, which keeps the script's products small
//! without changing a single result. Clock-aligned windows are placed by the script on the grid
//! through a reference window start computed here from the application's clock: any window start
//! on the grid will do, so a skewed application clock moves nothing, and the script's arithmetic
//! stays relative to now, where it is exact.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_core::{Alignment, Decision, Policy, StoreError, Timestamp};

/// The largest integer Lua (doubles) holds exactly: every number a script sees stays below it.
pub(crate) const EXACT: u64 = 1 << 53;

/// How many script arguments one check takes.
pub(crate) const ARGS_PER_CHECK: usize = 7;

/// How many values the check script returns per check.
pub(crate) const REPLY_PER_CHECK: usize = 6;

/// A parameter the script can hold exactly, or a refusal naming it.
fn exact(what: &str, value: u64) -> Result<u64, StoreError> {
    if value < EXACT {
        Ok(value)
    } else {
        Err(StoreError::Rejected(format!(
            "the {what} {value} is too large for the redis store, which computes in Lua doubles \
             (at most 2^53 - 1, about 104 days in nanoseconds); use a smaller {what}, or the \
             memory store"
        )))
    }
}

/// A duration in nanoseconds that the script can hold exactly, or a refusal.
fn exact_nanos(what: &str, d: Duration) -> Result<u64, StoreError> {
    exact(what, u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A backlog of `count` intervals of `interval` ns that the script can hold exactly, or a
/// refusal. GCRA and the queue store a time up to `count` intervals ahead of now, and compare
/// backlogs with that product: beyond 2⁵³ ns a double would round it.
fn exact_backlog(what: &str, count: u64, interval: u64) -> Result<(), StoreError> {
    match count.checked_mul(interval) {
        Some(span) if span < EXACT => Ok(()),
        _ => Err(StoreError::Rejected(format!(
            "a {what} of {count} at {interval} ns each takes 2^53 ns (about 104 days) or more to \
             drain, longer than the redis store computes exactly in Lua doubles; lower the \
             {what} or raise the rate, or use the memory store"
        ))),
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The application's idea of now, shifted by the store's offset. Used only to pick a reference
/// window start, so its accuracy does not matter within the 104-day exact range.
pub(crate) fn app_now(offset_nanos: i64) -> Timestamp {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos();
    let shifted = i128::try_from(wall).unwrap_or(i128::MAX) + i128::from(offset_nanos);
    Timestamp::from_nanos(u64::try_from(shifted.max(0)).unwrap_or(u64::MAX))
}

/// Appends the seven arguments of one check to `args`. `token` is the refund token (empty for a
/// check).
pub(crate) fn push_check(
    args: &mut Vec<String>,
    policy: &Policy,
    cost: u64,
    now: Timestamp,
    token: &str,
) -> Result<(), StoreError> {
    // Every limit is below EXACT, so a larger cost is refused as permanently as the real one.
    let cost = cost.min(EXACT);
    let (code, p): (u8, [String; 4]) = match policy {
        Policy::TokenBucket(tb) => {
            let (amount, per) = reduced(tb.rate().amount(), tb.rate().per());
            (
                1,
                [
                    exact("capacity", tb.capacity())?.to_string(),
                    exact("refill amount", amount)?.to_string(),
                    exact("refill period", per)?.to_string(),
                    String::new(),
                ],
            )
        }
        Policy::Gcra(g) => {
            let burst = exact("burst", g.burst())?;
            let interval = exact_nanos("emission interval", g.emission_interval())?;
            exact_backlog("burst", burst, interval)?;
            (
                2,
                [
                    burst.to_string(),
                    interval.to_string(),
                    String::new(),
                    String::new(),
                ],
            )
        }
        Policy::LeakyQueue(q) => {
            let rate = q.rate();
            let interval = u64::try_from(q.release_interval().as_nanos()).unwrap_or(u64::MAX);
            let max_wait = u64::try_from(q.max_wait().as_nanos()).unwrap_or(u64::MAX);
            let capacity = exact("queue capacity", q.capacity())?;
            let interval = exact("release interval", interval)?;
            if rate.amount() > 0 {
                exact_backlog("queue capacity", capacity, interval)?;
            }
            (
                3,
                [
                    capacity.to_string(),
                    interval.to_string(),
                    // A wait beyond the exact range is as good as unbounded.
                    max_wait.min(EXACT - 1).to_string(),
                    u8::from(rate.amount() == 0).to_string(),
                ],
            )
        }
        Policy::FixedWindow(fw) => {
            let window = exact_nanos("window", fw.window())?;
            let (aligned, reference) = match fw.alignment() {
                Alignment::Clock { .. } => (1, fw.window_start(Timestamp::EPOCH, now)),
                Alignment::FirstRequest => (0, Timestamp::EPOCH),
            };
            (
                4,
                [
                    exact("limit", fw.limit())?.to_string(),
                    window.to_string(),
                    aligned.to_string(),
                    reference.as_nanos().to_string(),
                ],
            )
        }
        Policy::SlidingLog(sl) => (
            5,
            [
                sl.limit().to_string(),
                exact_nanos("window", sl.window())?.to_string(),
                String::new(),
                String::new(),
            ],
        ),
        Policy::SlidingCounter(sc) => {
            let window = exact_nanos("window", sc.window())?;
            let n = now.as_nanos();
            (
                6,
                [
                    sc.limit().to_string(),
                    window.to_string(),
                    String::new(),
                    (n - n % window).to_string(),
                ],
            )
        }
    };
    args.push(code.to_string());
    args.push(cost.to_string());
    args.extend(p);
    args.push(token.to_owned());
    Ok(())
}

/// A rate of `amount` per `per` in lowest terms, `per` in nanoseconds.
fn reduced(amount: u64, per: Duration) -> (u64, u64) {
    let per = u64::try_from(per.as_nanos()).unwrap_or(u64::MAX);
    match gcd(amount, per) {
        0 => (amount, per),
        g => (amount / g, per / g),
    }
}

/// One check's reply from the check script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    /// The decision.
    pub(crate) decision: Decision,
    /// What identifies the consumed units for a refund (empty when nothing was consumed).
    pub(crate) token: String,
}

/// Decodes the check script's reply for checks with these `limits`, in order.
pub(crate) fn decode_replies(
    value: redis::Value,
    limits: impl ExactSizeIterator<Item = u64>,
) -> Result<Vec<Reply>, StoreError> {
    let bad = |what: &str| {
        StoreError::Rejected(format!(
            "the check script answered {what}; is another program using this key prefix?"
        ))
    };
    let redis::Value::Array(items) = value else {
        return Err(bad("something other than an array"));
    };
    if items.len() != limits.len() * REPLY_PER_CHECK {
        return Err(bad("the wrong number of values"));
    }
    let int = |v: &redis::Value| match v {
        redis::Value::Int(i) => Ok(*i),
        _ => Err(bad("a non-integer where an integer belongs")),
    };
    let nanos = |i: i64| Duration::from_nanos(u64::try_from(i).unwrap_or(0));
    items
        .chunks_exact(REPLY_PER_CHECK)
        .zip(limits)
        .map(|(c, limit)| {
            let retry = int(&c[3])?;
            let decision = Decision {
                allowed: int(&c[0])? == 1,
                limit,
                remaining: u64::try_from(int(&c[1])?).unwrap_or(0),
                reset_after: nanos(int(&c[2])?),
                retry_after: if retry < 0 {
                    Decision::NEVER
                } else {
                    nanos(retry)
                },
                delay: nanos(int(&c[4])?),
            };
            let token = match &c[5] {
                redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            };
            Ok(Reply { decision, token })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{Gcra, LeakyQueue, Rate, TokenBucket};

    #[test]
    fn rates_are_reduced_to_lowest_terms() {
        assert_eq!(reduced(10, Duration::from_secs(1)), (1, 100_000_000));
        assert_eq!(reduced(3, Duration::from_secs(1)), (3, 1_000_000_000));
        assert_eq!(reduced(0, Duration::from_secs(1)), (0, 1));
    }

    #[test]
    fn parameters_beyond_doubles_are_refused_not_rounded() {
        let p = Policy::from(TokenBucket::new(EXACT, Rate::per_second(1)).unwrap());
        let mut args = Vec::new();
        let err = push_check(&mut args, &p, 1, Timestamp::from_secs(1), "").unwrap_err();
        assert!(!err.is_transient());
        assert!(err.to_string().contains("capacity"));
    }

    #[test]
    fn backlogs_beyond_doubles_are_refused_not_rounded() {
        let largest = (EXACT - 1) / 1_000_000_000;
        let mut args = Vec::new();
        let now = Timestamp::from_secs(1);
        for burst in [largest, largest + 1] {
            let p = Policy::from(Gcra::new(Rate::per_second(1), burst).unwrap());
            let refused = push_check(&mut args, &p, 1, now, "").is_err();
            assert_eq!(refused, burst > largest, "burst {burst}");
        }
        let hour = Duration::from_secs(3600);
        for size in [largest - 1, largest] {
            let p = Policy::from(LeakyQueue::new(Rate::per_second(1), size, hour).unwrap());
            let err = push_check(&mut args, &p, 1, now, "").err();
            assert_eq!(err.is_some(), size == largest, "queue size {size}");
            if let Some(err) = err {
                assert!(!err.is_transient());
                assert!(err.to_string().contains("104 days"), "{err}");
            }
        }
        // A queue with a rate of 0 admits nothing, so its capacity builds no backlog.
        let p = Policy::from(LeakyQueue::new(Rate::per_second(0), largest, hour).unwrap());
        assert!(push_check(&mut args, &p, 1, now, "").is_ok());
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
