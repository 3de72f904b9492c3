//! Reservation ids: what `/v1/reserve` hands out and `/v1/settle` names.

use std::fmt;
use std::hash::Hasher;
use std::str::FromStr;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use siphasher::sip128::{Hasher128, SipHasher24};

/// The id of one reservation: 128 unguessable bits, written `rsv_` and 32 lowercase hex digits.
///
/// Unguessable rather than counted in the clear, so that one client cannot guess, and settle,
/// another's reservation, and so that instances sharing a store never hand out the same id
/// without coordinating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReservationId(u128);

/// The prefix of a reservation id's text form.
const PREFIX: &str = "rsv_";

impl ReservationId {
    /// A fresh id: SipHash-2-4 (128-bit output) of a process-wide counter, under a 128-bit key
    /// drawn once from the operating system's random source.
    ///
    /// Without the key, an id tells nothing of the next (SipHash is a pseudorandom function),
    /// and two processes' ids collide no more often than random ones: each has its own key.
    /// Drawing 16 random bytes for every id made each reservation a `getrandom` system call.
    /// A process that cannot read the random source gets ids from the time and a counter,
    /// which are unique if guessable.
    pub fn random() -> Self {
        static KEYS: LazyLock<Option<(u64, u64)>> = LazyLock::new(|| {
            let mut bytes = [0u8; 16];
            getrandom::fill(&mut bytes).ok()?;
            let (k0, k1) = bytes.split_at(8);
            Some((
                u64::from_le_bytes(k0.try_into().ok()?),
                u64::from_le_bytes(k1.try_into().ok()?),
            ))
        });
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let Some((k0, k1)) = *KEYS else {
            return ReservationId(fallback());
        };
        let mut h = SipHasher24::new_with_keys(k0, k1);
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        ReservationId(h.finish128().as_u128())
    }

    /// The id with these bits.
    pub const fn from_u128(bits: u128) -> Self {
        ReservationId(bits)
    }

    /// Its bits.
    pub const fn as_u128(self) -> u128 {
        self.0
    }

    /// Its text form, `rsv_` and 32 lowercase hex digits, as ASCII bytes: what [`Display`]
    /// writes, without going through a formatter, for answers that write it into a buffer.
    ///
    /// [`Display`]: fmt::Display
    pub fn to_ascii(self) -> [u8; TEXT_LEN] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut text = [0u8; TEXT_LEN];
        text[..PREFIX.len()].copy_from_slice(PREFIX.as_bytes());
        for (i, digit) in text[PREFIX.len()..].iter_mut().enumerate() {
            let shift = 4 * (HEX_DIGITS - 1 - i);
            *digit = DIGITS[(self.0 >> shift) as usize & 0xf];
        }
        text
    }
}

/// The hex digits of an id's text form.
const HEX_DIGITS: usize = 32;

/// The length of an id's text form.
const TEXT_LEN: usize = PREFIX.len() + HEX_DIGITS;

/// A unique id where no random source exists: the wall clock in nanoseconds beside a counter.
fn fallback() -> u128 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (u128::from(now) << 64) | u128::from(COUNTER.fetch_add(1, Ordering::Relaxed))
}

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.to_ascii();
        // Only ASCII digits and the prefix: always UTF-8.
        f.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
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
        // Exactly one spelling per id: lowercase digits only, no sign, exactly 32 of them.
        if hex.len() != HEX_DIGITS {
            return Err(MalformedReservationId);
        }
        hex.bytes()
            .try_fold(0u128, |bits, b| {
                let digit = match b {
                    b'0'..=b'9' => b - b'0',
                    b'a'..=b'f' => b - b'a' + 10,
                    _ => return None,
                };
                Some(bits << 4 | u128::from(digit))
            })
            .map(ReservationId)
            .ok_or(MalformedReservationId)
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

    /// Ids from a counter under a secret key: many in a row are all distinct, and their bits
    /// show no counter (each bit is set in about half of them, the low ones included).
    #[test]
    fn ids_in_a_row_are_distinct_and_look_random() {
        let ids: Vec<u128> = (0..4096)
            .map(|_| ReservationId::random().as_u128())
            .collect();
        let distinct: std::collections::HashSet<u128> = ids.iter().copied().collect();
        assert_eq!(distinct.len(), ids.len());
        for bit in [0, 1, 7, 63, 64, 127] {
            let set = ids.iter().filter(|id| *id >> bit & 1 == 1).count();
            assert!(
                (1700..2400).contains(&set),
                "bit {bit} set in {set} of 4096"
            );
        }
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
            prop_assert_eq!(&text, &format!("rsv_{bits:032x}"));
            prop_assert_eq!(text.as_bytes(), &id.to_ascii()[..]);
            prop_assert_eq!(text.parse::<ReservationId>(), Ok(id));
        }
    }
}
