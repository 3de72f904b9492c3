//! Statistics names as envoyproxy/ratelimit writes them: a descriptor key made safe for statsd
//! (its `SanitizeStatName`), the key of a per-request limit, and the `EXTRA_TAGS` suffix its
//! statsd library adds to every name.

use std::collections::BTreeMap;

use sluice_limiter::RequestDescriptor;

/// Makes `name` safe as a statsd name, as Envoy does: `:` and `|` (which end a statsd name and
/// its value) become `_`, and so do the dots of anything shaped as an IPv4 address, so that an
/// address in a value does not add levels to the name. A line break, which would end the
/// statsd line itself, becomes `_` too; Envoy leaves it and sends a broken line.
pub(super) fn sanitize(name: &mut String) {
    // Most keys hold nothing to replace: no separator, and no dot between two digits, which
    // every address has.
    let b = name.as_bytes();
    let replaces = b.iter().enumerate().any(|(i, c)| match c {
        b':' | b'|' | b'\n' | b'\r' => true,
        b'.' => i > 0 && b[i - 1].is_ascii_digit() && b.get(i + 1).is_some_and(u8::is_ascii_digit),
        _ => false,
    });
    if !replaces {
        return;
    }
    let mut bytes = std::mem::take(name).into_bytes();
    for b in &mut bytes {
        if matches!(*b, b':' | b'|' | b'\n' | b'\r') {
            *b = b'_';
        }
    }
    let mut at = 0;
    while at < bytes.len() {
        if !bytes[at].is_ascii_digit() {
            at += 1;
            continue;
        }
        match ipv4_at(&bytes[at..]) {
            Some(len) => {
                for b in &mut bytes[at..at + len] {
                    if *b == b'.' {
                        *b = b'_';
                    }
                }
                at += len;
            }
            None => at += 1,
        }
    }
    // Only ASCII bytes were replaced by ASCII bytes: the text is still UTF-8.
    *name = String::from_utf8(bytes)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
}

/// The length of the IPv4-shaped text (four groups of one to three digits joined by dots) that
/// `s` starts with, if any. Each group takes as many digits as it can and gives them back only
/// if the rest cannot match, which is the match Envoy's regular expression finds.
fn ipv4_at(s: &[u8]) -> Option<usize> {
    fn group(s: &[u8], at: usize, more: u32) -> Option<usize> {
        let digits = s[at.min(s.len())..]
            .iter()
            .take(3)
            .take_while(|b| b.is_ascii_digit())
            .count();
        (1..=digits).rev().find_map(|n| {
            let end = at + n;
            if more == 0 {
                Some(end)
            } else if s.get(end) == Some(&b'.') {
                group(s, end + 1, more - 1)
            } else {
                None
            }
        })
    }
    group(s, 0, 3)
}

/// Appends the key Envoy names the statistics of a per-request limit by: the domain, then every
/// entry as `key` or `key_value`, joined by `.`.
pub(super) fn write_override_key(domain: &str, descriptor: &RequestDescriptor, out: &mut String) {
    out.push_str(domain);
    for (key, value) in &descriptor.entries {
        out.push('.');
        out.push_str(key);
        if !value.is_empty() {
            out.push('_');
            out.push_str(value);
        }
    }
}

/// The suffix that `EXTRA_TAGS` adds to every statistics name, as Envoy's statsd library writes
/// tags into a plain statsd name: `.__key=value` for each tag, in key order, with `.`, `:` and
/// `|` in a value made `_`; a tag with an empty key or value is left out.
pub(super) fn tag_suffix(tags: &[(String, String)]) -> String {
    let tags: BTreeMap<&str, &str> = tags
        .iter()
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut suffix = String::new();
    for (key, value) in tags {
        suffix.push_str(".__");
        suffix.push_str(key);
        suffix.push('=');
        suffix.extend(
            value
                .chars()
                .map(|c| if matches!(c, '.' | ':' | '|') { '_' } else { c }),
        );
    }
    suffix
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sanitized(name: &str) -> String {
        let mut name = name.to_owned();
        sanitize(&mut name);
        name
    }

    #[test]
    fn separators_and_addresses_are_made_safe_as_envoy_makes_them() {
        assert_eq!(sanitized("d.k_a:b|c"), "d.k_a_b_c");
        assert_eq!(
            sanitized("d.remote_address_10.0.0.1"),
            "d.remote_address_10_0_0_1"
        );
        // The leftmost match wins, each group as long as it can be.
        assert_eq!(sanitized("d.ip_1234.5.6.7.8"), "d.ip_1234_5_6_7.8");
        assert_eq!(sanitized("d.v_1.2.3"), "d.v_1.2.3");
        assert_eq!(sanitized("d.a_1.2.3.4.b_5.6.7.8"), "d.a_1_2_3_4.b_5_6_7_8");
        assert_eq!(sanitized("d.k_line\nbreak"), "d.k_line_break");
        assert_eq!(sanitized("d.k_é.1.2.3.4"), "d.k_é.1_2_3_4");
        assert_eq!(sanitized("d.user_1234.n_5"), "d.user_1234.n_5");
    }

    #[test]
    fn an_override_is_named_by_its_entries() {
        let d = RequestDescriptor::new([("a", "1"), ("b", "")]);
        let mut key = String::new();
        write_override_key("dom", &d, &mut key);
        assert_eq!(key, "dom.a_1.b");
    }

    #[test]
    fn tags_are_sorted_and_their_values_made_safe() {
        let tags = [
            ("version".to_owned(), "1.2:3".to_owned()),
            ("env".to_owned(), "prod".to_owned()),
            ("empty".to_owned(), String::new()),
        ];
        assert_eq!(tag_suffix(&tags), ".__env=prod.__version=1_2_3");
        assert_eq!(tag_suffix(&[]), "");
    }
}
