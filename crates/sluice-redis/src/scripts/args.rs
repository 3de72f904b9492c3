//! Policies and costs as script arguments.
//!
//! Each check takes seven arguments: algorithm code, cost, four parameters and a refund token.
//!
//! Each algorithm's file in `lua/algorithm/` says what its four parameters are.
//!
//! The algorithm code is [`code`] of the policy's algorithm, and the parameters are what its
//! module in `sluice-core` makes of the policy (`Policy::store_params`), in the order of its Lua
//! file.
//!
//! The refill rate is reduced to lowest terms first, which keeps the script's products small
//! without changing a single result. Clock-aligned windows are placed by the script on the grid
//! through a reference window start computed from the application's clock: any window start on
//! the grid will do, so a skewed application clock moves nothing, and the script's arithmetic
//! stays relative to now, where it is exact.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_core::{Policy, StoreError, Timestamp};

use super::algorithm::code;
use super::exact::{EXACT, check_exact};

/// One script argument: a number, or text of up to 22 bytes, kept inline; longer text (a refund
/// token may be) on the heap. A check's seven arguments cost no allocation of their own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Arg {
    Inline { len: u8, bytes: [u8; INLINE] },
    Text(String),
}

const INLINE: usize = 22;

impl Arg {
    /// `n` in decimal.
    pub(crate) fn int(n: i64) -> Self {
        let mut bytes = [0u8; INLINE];
        let mut at = crate::pipe::decimal(n.unsigned_abs(), &mut bytes);
        if n < 0 {
            at -= 1;
            bytes[at] = b'-';
        }
        bytes.copy_within(at.., 0);
        Arg::Inline {
            len: (INLINE - at) as u8,
            bytes,
        }
    }

    /// `n` in decimal.
    pub(crate) fn uint(n: u64) -> Self {
        match i64::try_from(n) {
            Ok(n) => Arg::int(n),
            Err(_) => Arg::Text(n.to_string()),
        }
    }

    /// `text` as it is.
    pub(crate) fn text(text: &str) -> Self {
        if text.len() > INLINE {
            return Arg::Text(text.to_owned());
        }
        let mut bytes = [0u8; INLINE];
        bytes[..text.len()].copy_from_slice(text.as_bytes());
        Arg::Inline {
            len: text.len() as u8,
            bytes,
        }
    }
}

impl AsRef<[u8]> for Arg {
    fn as_ref(&self) -> &[u8] {
        match self {
            Arg::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Arg::Text(text) => text.as_bytes(),
        }
    }
}

/// How many script arguments one check takes.
pub(crate) const ARGS_PER_CHECK: usize = 7;

/// Appends the seven arguments of one check to `args`. `token` is the refund token (empty for a
/// check). A policy the script cannot hold exactly is refused here too, not rounded.
pub(crate) fn push_check(
    args: &mut Vec<Arg>,
    policy: &Policy,
    cost: u64,
    now: Timestamp,
    token: &str,
) -> Result<(), StoreError> {
    check_exact(policy).map_err(StoreError::Rejected)?;
    // Every limit is below EXACT, so a larger cost is refused as permanently as the real one.
    let cost = cost.min(EXACT);
    let p = policy
        .store_params(now)
        .map(|p| p.map_or_else(|| Arg::text(""), Arg::uint));
    args.push(Arg::uint(u64::from(code(policy.algorithm()))));
    args.push(Arg::uint(cost));
    args.extend(p);
    args.push(Arg::text(token));
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

    /// A rate of `amount` per `per` in lowest terms, `per` in nanoseconds.
    fn reduced(amount: u64, per: Duration) -> (u64, u64) {
        Rate::new(amount, per).unwrap().lowest_terms()
    }

    #[test]
    fn huge_costs_stay_permanent_denials() {
        let p = Policy::from(TokenBucket::new(5, Rate::per_second(1)).unwrap());
        let mut args = Vec::new();
        push_check(&mut args, &p, u64::MAX, Timestamp::from_secs(1), "").unwrap();
        assert_eq!(args.len(), ARGS_PER_CHECK);
        assert_eq!(args[1].as_ref(), EXACT.to_string().as_bytes());
    }

    #[test]
    fn arguments_read_as_their_decimal_or_text() {
        for n in [0, 7, -7, 1_000_000_007, i64::MAX, i64::MIN] {
            assert_eq!(Arg::int(n).as_ref(), n.to_string().as_bytes());
        }
        for n in [0, u64::MAX, 1 << 63, (1 << 63) - 1] {
            assert_eq!(Arg::uint(n).as_ref(), n.to_string().as_bytes());
        }
        for text in ["", "c-", "a".repeat(22).as_str(), "b".repeat(23).as_str()] {
            assert_eq!(Arg::text(text).as_ref(), text.as_bytes());
        }
    }
}
