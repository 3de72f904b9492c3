//! Counter keys: the name under which a store keeps one counter.
//!
//! A key reads `{domain|key=value|key=value}:policy`, for example
//! `{api|user=alice|path=%2Fv1%2Forders}:5d0c2f1e8a7b3c94`.
//!
//! - **Injective.** Every byte outside a small safe set is percent-encoded, so the separators
//!   `{ } | = : % *` never occur inside a component and two different descriptors never produce
//!   the same key. A `share_threshold` wildcard is the one place a raw `*` appears.
//! - **Redis-safe.** The identity sits in a hash tag, so every limit of one descriptor lands in
//!   one Cluster slot and is checked by one script; no component can close the tag early.
//! - **Bounded.** An identity longer than [`MAX_IDENTITY_LEN`] is replaced by a 128-bit hash of
//!   itself (`{#…}`), so a client sending a megabyte header cannot create a megabyte key.
//! - **Stable across reloads, fresh across changes.** The suffix hashes the policy's parameters
//!   (not its position in the file), so an unchanged rule keeps its counters when the file is
//!   reloaded, while a changed limit starts from a clean counter instead of misreading state
//!   written under different parameters. The hash is computed from the parameters' values with
//!   fixed keys, so every instance and every build agrees on it.

use std::fmt::Write as _;
use std::hash::Hasher;

use siphasher::sip::SipHasher13;
use siphasher::sip128::{Hasher128, SipHasher13 as SipHasher13x128};
use sluice_core::Policy;

/// The longest identity (the part inside `{}`) kept readable; longer ones are hashed.
pub const MAX_IDENTITY_LEN: usize = 192;

/// The longest key [`crate::RuleSet::checks`] produces: braces, a hashed or readable identity, a
/// colon and the 16-digit policy hash.
pub const MAX_KEY_LEN: usize = MAX_IDENTITY_LEN + 2 + 1 + 16;

/// Fixed hash keys. They are not secret: they only need to be the same on every instance, so
/// that all instances name a counter alike.
const KEY0: u64 = 0x736c_7569_6365_2d6b;
const KEY1: u64 = 0x6579_732d_7631_0000;

/// Which bytes are written as themselves in a key component: a table, so that a component is
/// copied in runs between the bytes that need encoding rather than a byte at a time.
static SAFE: [bool; 256] = {
    let mut safe = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        safe[b] = c.is_ascii_alphanumeric()
            || matches!(c, b'-' | b'.' | b'_' | b'~' | b'/' | b'@' | b'+' | b',');
        b += 1;
    }
    safe
};

/// Appends `component` percent-encoded.
pub(crate) fn push_encoded(out: &mut String, component: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let bytes = component.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        let run = bytes[at..]
            .iter()
            .position(|&b| !SAFE[usize::from(b)])
            .unwrap_or(bytes.len() - at);
        // Safe bytes are ASCII, so a run of them begins and ends on character boundaries.
        if let Some(safe) = component.get(at..at + run).filter(|_| run > 0) {
            out.push_str(safe);
            at += run;
        }
        if let Some(&b) = bytes.get(at) {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xF)]));
            at += 1;
        }
    }
}

/// Room to reserve after an identity for the closing `}:` and the policy hash.
pub(crate) const KEY_SUFFIX_LEN: usize = 2 + 16;

/// Turns `buf`, holding `{` and an identity (`domain|k=v|…`), into the final key with the policy
/// hash. Takes the buffer by value so the common case (one limit) allocates once.
pub(crate) fn close_key(mut buf: String, policy_id: &str) -> String {
    if buf.len() - 1 > MAX_IDENTITY_LEN {
        let mut h = SipHasher13x128::new_with_keys(KEY0, KEY1);
        h.write(&buf.as_bytes()[1..]);
        buf.clear();
        let _ = write!(buf, "{{#{:032x}", h.finish128().as_u128());
    }
    buf.push_str("}:");
    buf.push_str(policy_id);
    buf
}

/// [`close_key`] for an identity without the brace.
#[cfg(test)]
pub(crate) fn finish_key(identity: &str, policy_id: &str) -> String {
    close_key(format!("{{{identity}"), policy_id)
}

/// The policy's identity: 16 hex digits hashed from its algorithm and parameters.
pub(crate) fn policy_id(policy: &Policy) -> String {
    let canonical = policy.key_id();
    let mut h = SipHasher13::new_with_keys(KEY0, KEY1);
    h.write(canonical.as_bytes());
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sluice_core::{Alignment, FixedWindow, Rate, TokenBucket};

    use super::*;

    fn enc(s: &str) -> String {
        let mut out = String::new();
        push_encoded(&mut out, s);
        out
    }

    #[test]
    fn separators_never_survive_encoding() {
        assert_eq!(enc("a|b=c{d}:e%f*g h"), "a%7Cb%3Dc%7Bd%7D%3Ae%25f%2Ag%20h");
        assert_eq!(enc("/v1/orders"), "/v1/orders");
        assert_eq!(enc("é"), "%C3%A9");
        assert_eq!(enc("aé-b"), "a%C3%A9-b");
        assert_eq!(enc("€x"), "%E2%82%ACx");
        assert_eq!(enc("%"), "%25");
        assert_eq!(enc(""), "");
    }

    proptest::proptest! {
        /// Copying runs of safe bytes gives what encoding each byte in turn gives.
        #[test]
        fn runs_encode_as_single_bytes_do(s in "\\PC{0,40}") {
            let mut bytewise = String::new();
            for &b in s.as_bytes() {
                if b.is_ascii_alphanumeric() || b"-._~/@+,".contains(&b) {
                    bytewise.push(char::from(b));
                } else {
                    bytewise.push_str(&format!("%{b:02X}"));
                }
            }
            proptest::prop_assert_eq!(enc(&s), bytewise);
        }
    }

    #[test]
    fn long_identities_are_hashed_and_bounded() {
        let long = "x".repeat(10_000);
        let key = finish_key(&long, "0123456789abcdef");
        assert!(key.len() <= MAX_KEY_LEN, "{}", key.len());
        assert!(key.starts_with("{#"));
        let other = finish_key(&"y".repeat(10_000), "0123456789abcdef");
        assert_ne!(key, other);
    }

    #[test]
    fn policy_ids_follow_parameters() {
        let a = Policy::from(
            FixedWindow::new(
                10,
                Duration::from_secs(60),
                Alignment::Clock { utc_offset_secs: 0 },
            )
            .unwrap(),
        );
        let b = Policy::from(
            FixedWindow::new(
                11,
                Duration::from_secs(60),
                Alignment::Clock { utc_offset_secs: 0 },
            )
            .unwrap(),
        );
        let c = Policy::from(TokenBucket::new(10, Rate::per_minute(10)).unwrap());
        assert_eq!(policy_id(&a), policy_id(&a.clone()));
        assert_ne!(policy_id(&a), policy_id(&b));
        assert_ne!(policy_id(&a), policy_id(&c));
        assert_eq!(policy_id(&a).len(), 16);
        // Pinned, so a change to the canonical form (which would reset every counter in every
        // deployment on upgrade) is a deliberate decision, not an accident.
        assert_eq!(
            a.key_id(),
            "fixed_window;limit=10;window=60000000000;align=clock+0"
        );
    }
}
