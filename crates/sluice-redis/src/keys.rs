//! Redis key names for counters, and the Cluster slot each one falls in.
//!
//! A counter key is `prefix:{identity}`: the counter's identity is the hash tag, so everything
//! stored for one counter shares a slot, and a script may touch it atomically on any topology.
//! `{` and `}` inside the identity (and the prefix) are escaped, so that user data such as a
//! header value cannot end the tag early and move a counter to another slot, or make two
//! identities share one key.
//!
//! An identity that carries its own tag is kept as it is: `prefix:{tag}rest`. Every key the rules
//! produce does (`{domain|key=value}:policy`, see `sluice_rules::key`), so all the limits of one
//! descriptor fall in one slot and are checked by one script, atomically, on a Cluster too.

use std::borrow::Cow;

/// The number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16_384;

/// Escapes `\`, `{` and `}` as `\\`, `\(` and `\)`: injective, and leaves no brace behind.
pub(crate) fn escape(s: &str) -> Cow<'_, str> {
    if !s.contains(['\\', '{', '}']) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '{' => out.push_str("\\("),
            '}' => out.push_str("\\)"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// The Redis key of the counter `identity` under `prefix` (already escaped): `prefix:identity`
/// when the identity carries its own tag, `prefix:{escaped identity}` otherwise.
///
/// The two forms never meet, so no two identities share a key: a kept identity never ends with
/// `}` (what follows its tag is not empty and holds no brace), and a wrapped one always does.
pub(crate) fn counter_key(escaped_prefix: &str, identity: &str) -> String {
    counter_key_with(escaped_prefix, identity, "")
}

/// [`counter_key`] with `suffix` appended, built in one allocation.
pub(crate) fn counter_key_with(escaped_prefix: &str, identity: &str, suffix: &str) -> String {
    if has_own_tag(identity) {
        let mut key =
            String::with_capacity(escaped_prefix.len() + 1 + identity.len() + suffix.len());
        key.push_str(escaped_prefix);
        key.push(':');
        key.push_str(identity);
        key.push_str(suffix);
        return key;
    }
    let id = escape(identity);
    let mut key = String::with_capacity(escaped_prefix.len() + id.len() + 3 + suffix.len());
    key.push_str(escaped_prefix);
    key.push_str(":{");
    key.push_str(&id);
    key.push('}');
    key.push_str(suffix);
    key
}

/// Whether `identity` is `{tag}rest` with a non-empty tag, a non-empty rest, and no other brace
/// or backslash anywhere: a hash tag that no request data can have shaped, kept as Redis reads it.
fn has_own_tag(identity: &str) -> bool {
    let bytes = identity.as_bytes();
    if bytes.first() != Some(&b'{') {
        return false;
    }
    let mut close = None;
    for (i, &b) in bytes.iter().enumerate().skip(1) {
        match b {
            b'}' if close.is_none() => close = Some(i),
            b'{' | b'}' | b'\\' => return false,
            _ => {}
        }
    }
    close.is_some_and(|c| c > 1 && c + 1 < bytes.len())
}

/// The Cluster slot of a key, by Redis's rule: CRC16 of the hash tag if the key has a non-empty
/// one, of the whole key otherwise.
pub fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as Redis Cluster uses.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_cluster_specification() {
        // The reference value from the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        // Known slots, as `CLUSTER KEYSLOT` reports them.
        assert_eq!(slot(b"foo"), 12_182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
    }

    #[test]
    fn braces_in_identities_cannot_break_the_tag() {
        let k = counter_key("sluice", "a}b{c");
        assert_eq!(k, "sluice:{a\\)b\\(c}");
        assert_eq!(slot(k.as_bytes()), slot(b"a\\)b\\(c"));
        // Escaping is injective: a literal backslash sequence stays distinct.
        assert_ne!(counter_key("p", "a}"), counter_key("p", "a\\)"));
    }

    #[test]
    fn a_rule_key_keeps_its_own_tag_so_a_descriptor_has_one_slot() {
        let per_second = counter_key("sluice", "{api|user=1}:0123456789abcdef");
        let per_day = counter_key("sluice", "{api|user=1}:fedcba9876543210");
        assert_eq!(per_second, "sluice:{api|user=1}:0123456789abcdef");
        assert_eq!(slot(per_second.as_bytes()), slot(per_day.as_bytes()));
        assert_eq!(slot(per_second.as_bytes()), slot(b"api|user=1"));
    }

    #[test]
    fn kept_and_wrapped_identities_never_share_a_key() {
        // Not kept: no tag, an empty tag, nothing after the tag, a second brace, a backslash.
        for wrapped in ["x", "{}x", "{x}", "{x}{y}", "{x}y}", "{x\\}y", "a{x}y"] {
            assert!(!has_own_tag(wrapped), "{wrapped}");
            assert!(counter_key("p", wrapped).ends_with('}'), "{wrapped}");
        }
        assert!(has_own_tag("{x}y"));
        assert!(!counter_key("p", "{x}y").ends_with('}'));
        // The identities that come closest to each other's keys stay apart.
        let identities = ["{x}", "x", "{x}y", "\\(x\\)y", "{x}:y", "x}:y", "{x\\)y"];
        for (i, a) in identities.iter().enumerate() {
            for b in &identities[i + 1..] {
                assert_ne!(counter_key("p", a), counter_key("p", b), "{a} and {b}");
            }
        }
    }

    #[test]
    fn one_identity_one_slot_whatever_the_prefix() {
        assert_eq!(
            slot(counter_key("a", "{api|user=1}").as_bytes()),
            slot(counter_key("other:prefix", "{api|user=1}").as_bytes())
        );
    }
}
