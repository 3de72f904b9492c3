//! Reservation ids: what `/v1/reserve` hands out and `/v1/settle` names.

use std::fmt;
use std::str::FromStr;

/// The id of one reservation: 128 random bits, written `rsv_` and 32 lowercase hex digits.
///
/// Random rather than counted, so that one client cannot guess, and settle, another's
/// reservation, and so that instances sharing a store never hand out the same id without
/// coordinating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReservationId(u128);

/// The prefix of a reservation id's text form.
const PREFIX: &str = "rsv_";

impl ReservationId {
    /// A fresh id from the operating system's random source.
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        // The operating system's source only fails where it does not exist; a process that
        // cannot read it still gets distinct ids from the time and a counter, which are
        // unique if guessable.
        if getrandom::fill(&mut bytes).is_err() {
            return ReservationId(fallback());
        }
        ReservationId(u128::from_le_bytes(bytes))
    }

    /// The id with these bits.
    pub const fn from_u128(bits: u128) -> Self {
        ReservationId(bits)
    }

    /// Its bits.
    pub const fn as_u128(self) -> u128 {
        self.0
    }
}

/// A unique id where no random source exists: the wall clock in nanoseconds beside a counter.
fn fallback() -> u128 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (u128::from(now) << 64) | u128::from(COUNTER.fetch_add(1, Ordering::Relaxed))
}

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{:032x}", self.0)
    }
}

/// A text that is not a reservation id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a reservation id: expected `rsv_` and 32 lowercase hex digits")]
pub struct MalformedReservationId;

impl FromStr for ReservationId {
    type Err = MalformedReservationId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex = s.strip_prefix(PREFIX).ok_or(MalformedReservationId)?;
        // Exactly one spelling per id: `from_str_radix` alone would take a sign and upper case.
        if hex.len() != 32 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(MalformedReservationId);
        }
        u128::from_str_radix(hex, 16)
            .map(ReservationId)
            .map_err(|_| MalformedReservationId)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn random_ids_differ() {
        assert_ne!(ReservationId::random(), ReservationId::random());
    }

    #[test]
    fn other_spellings_are_refused() {
        for bad in [
            "",
            "rsv_",
            "rsv_0123",
            "RSV_0123456789abcdef0123456789abcdef",
            "rsv_0123456789ABCDEF0123456789abcdef",
            "rsv_+123456789abcdef0123456789abcdef",
            "rsv_0123456789abcdef0123456789abcdef0",
            "0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(
                bad.parse::<ReservationId>(),
                Err(MalformedReservationId),
                "{bad}"
            );
        }
    }

    proptest! {
        #[test]
        fn text_form_round_trips(bits: u128) {
            let id = ReservationId::from_u128(bits);
            let text = id.to_string();
            prop_assert_eq!(text.len(), 36);
            prop_assert_eq!(text.parse::<ReservationId>(), Ok(id));
        }
    }
}
