//! Writing JSON answers straight into their bytes: strings escaped as serde_json escapes them,
//! numbers as serde_json writes them. Building a `serde_json::Value` first cost a `/v1/check`
//! answer more than the rest of the request (a map per object, a string per key, all dropped
//! again): 56,800 instructions per `/v1/check` under callgrind, against 21,900 for `/json`.

use std::cell::RefCell;
use std::fmt;
use std::time::Duration;

use sluice_core::{Decision, Policy};

/// `s` as a JSON string, quoted and escaped: `"` and `\`, and control characters, in
/// serde_json's spelling (`\n`, `\t`, … and `\u001f`), so an answer reads byte for byte as it
/// did when serde_json wrote it.
pub(super) fn string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    escaped(out, s);
    out.push(b'"');
}

/// A name of Sluice's own vocabulary as a JSON string: an algorithm's, an action's, an outcome's,
/// or a header field's. They are lowercase words (a field's name is an HTTP token, which has no
/// quote, backslash or control character), so nothing is looked at for escaping: ten strings of
/// a `/v1/check` answer, half of them these, cost it about 1,900 instructions when each was.
pub(super) fn word(out: &mut Vec<u8>, s: &str) {
    debug_assert!(!needs_escaping(s.as_bytes()), "{s:?} needs escaping");
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
}

/// `s` escaped, without the quotes. Between the bytes to escape, eight plain bytes are passed at
/// a time: the rate-limit fields' values, with a quoted name in each, are escaped on every
/// `/v1/check` answer.
fn escaped(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    if !needs_escaping(bytes) {
        out.extend_from_slice(bytes);
        return;
    }
    let mut plain = 0;
    let mut i = 0;
    while i < bytes.len() {
        if let Some(word) = word_at(bytes, i)
            && !special(word)
        {
            i += 8;
            continue;
        }
        let b = bytes[i];
        i += 1;
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..0x20 => {
                out.extend_from_slice(&bytes[plain..i - 1]);
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
                plain = i;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[plain..i - 1]);
        out.extend_from_slice(escape);
        plain = i;
    }
    out.extend_from_slice(&bytes[plain..]);
}

/// The eight bytes of `bytes` from `at`, as a little-endian word, if there are eight.
fn word_at(bytes: &[u8], at: usize) -> Option<u64> {
    let chunk: [u8; 8] = bytes.get(at..at + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(chunk))
}

/// Whether a byte of `w` is a `"`, a `\` or a control character.
fn special(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // Whether a byte of `w` is below `n` (at most 128), exactly: the classic bit trick, with
    // bytes of 128 and above (UTF-8) masked out by `!w`.
    let below = |w: u64, n: u64| w.wrapping_sub(ONES * n) & !w & HIGHS != 0;
    below(w, 0x20) || below(w ^ (ONES * 0x22), 1) || below(w ^ (ONES * 0x5c), 1)
}

/// Whether `bytes` holds a `"`, a `\` or a control character: eight bytes at a time, as almost
/// no name, key or header value does, and a byte-by-byte escape cost a `/v1/check` answer about
/// 3,700 instructions.
fn needs_escaping(bytes: &[u8]) -> bool {
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        if special(u64::from_le_bytes(word)) {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

/// `value`'s text (its `Display`) as a JSON string, written without a `String` in between:
/// straight into `out`, then looked at once and escaped only if it must be. A `Display`
/// writes in many small pieces (a policy's description in a dozen or more), and escaping each
/// on its way cost a `/v1/check` answer about 280 instructions more; escaping is byte by byte,
/// so the whole escaped is the pieces escaped.
pub(super) fn display(out: &mut Vec<u8>, value: &impl fmt::Display) {
    struct Raw<'a>(&'a mut Vec<u8>);
    impl fmt::Write for Raw<'_> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0.extend_from_slice(s.as_bytes());
            Ok(())
        }
    }
    out.push(b'"');
    let start = out.len();
    // Writing into a `Vec` cannot fail; a `Display` that fails leaves what it wrote.
    let _ = fmt::write(&mut Raw(out), format_args!("{value}"));
    if needs_escaping(&out[start..]) {
        let text = out.split_off(start);
        // Written by `fmt` from `str`s, so it is UTF-8.
        escaped(out, &String::from_utf8_lossy(&text));
    }
    out.push(b'"');
}

/// A policy's description (its `Display`) as a JSON string. The last few policies described on
/// this thread keep their text: answers describe the same few policies over and over, and
/// writing one through `core::fmt` cost a `/v1/check` answer about 1,200 instructions. A few,
/// not one, so that a request under several limits does not make them take turns.
pub(super) fn description(out: &mut Vec<u8>, policy: &Policy) {
    thread_local! {
        static DESCRIBED: RefCell<Vec<(Policy, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
    }
    DESCRIBED.with_borrow_mut(|described| {
        if let Some((_, text)) = described.iter().find(|(p, _)| p == policy) {
            out.extend_from_slice(text);
            return;
        }
        let start = out.len();
        display(out, policy);
        if described.len() == DESCRIBED_KEPT {
            described.remove(0);
        }
        described.push((policy.clone(), out[start..].to_vec()));
    });
}

/// How many policies' descriptions a thread keeps.
const DESCRIBED_KEPT: usize = 8;

/// An unsigned integer.
pub(super) fn uint(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `true` or `false`.
pub(super) fn boolean(out: &mut Vec<u8>, b: bool) {
    out.extend_from_slice(if b { b"true" } else { b"false" });
}

/// A float as serde_json writes it (`0.0`, `3092.202261157`; `null` if not finite).
pub(super) fn float(out: &mut Vec<u8>, f: f64) {
    // A whole number of seconds (a window, a zero delay) is written as serde_json writes it,
    // digits and `.0`, without its float formatter (a unit test holds them equal up to 10^9).
    if f.is_sign_positive() && f < WHOLE_BELOW && f.fract() == 0.0 {
        // Whole and below 10^9: the conversion is exact.
        uint(out, f as u64);
        out.extend_from_slice(b".0");
        return;
    }
    // Writing a number into a `Vec` cannot fail.
    let _ = serde_json::to_writer(out, &f);
}

/// Whole numbers below this are written without the float formatter.
const WHOLE_BELOW: f64 = 1e9;

/// A duration in seconds, `null` for [`Decision::NEVER`]: the JSON form of
/// `sluice_http::admin::secs`.
pub(super) fn secs(out: &mut Vec<u8>, d: Duration) {
    if d == Decision::NEVER {
        out.extend_from_slice(b"null");
    } else {
        float(out, d.as_secs_f64());
    }
}

/// `"name":`, for a name that needs no escaping.
pub(super) fn key(out: &mut Vec<u8>, name: &str) {
    out.push(b'"');
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\":");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every name `word` writes needs no escaping, and is written as `string` writes it.
    #[test]
    fn the_vocabulary_written_as_words_needs_no_escaping() {
        use sluice_core::Algorithm;
        use sluice_limiter::Outcome;
        use sluice_rules::Action;

        let actions = [
            Action::Reject,
            Action::Shadow,
            Action::Fake {
                status: 200,
                content_type: String::new(),
                body: String::new(),
            },
            Action::Delay { max_wait: None },
            Action::Soft {
                header: String::new(),
            },
        ];
        let outcomes = [
            Outcome::Allowed,
            Outcome::Limited,
            Outcome::ShadowLimited,
            Outcome::StoreError,
            Outcome::Refunded,
        ];
        let fields = [
            "ratelimit",
            "ratelimit-policy",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "retry-after",
        ];
        let names = Algorithm::ALL
            .iter()
            .map(|a| a.name())
            .chain(actions.iter().map(Action::name))
            .chain(outcomes.iter().map(|o| o.name()))
            .chain(fields);
        for name in names {
            assert!(!needs_escaping(name.as_bytes()), "{name}");
            assert_eq!(
                written(|o| word(o, name)),
                written(|o| string(o, name)),
                "{name}"
            );
        }
    }

    fn written(f: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut out = Vec::new();
        f(&mut out);
        String::from_utf8(out).unwrap()
    }

    proptest! {
        /// Every string, control characters and non-ASCII included, is escaped as serde_json
        /// escapes it, through `string` and through `display` alike.
        #[test]
        fn strings_are_escaped_as_serde_json_escapes_them(s in "\\PC*|[\\x00-\\x7f]*") {
            let theirs = serde_json::to_string(&s).unwrap();
            prop_assert_eq!(&written(|o| string(o, &s)), &theirs);
            prop_assert_eq!(&written(|o| display(o, &s)), &theirs);
        }

        #[test]
        fn numbers_are_written_as_serde_json_writes_them(
            n: u64,
            f: f64,
            nanos: u64,
            whole in 0u64..2_000_000_000,
        ) {
            prop_assert_eq!(written(|o| uint(o, n)), serde_json::to_string(&n).unwrap());
            prop_assert_eq!(written(|o| float(o, f)), serde_json::to_string(&f).unwrap());
            let w = whole as f64;
            prop_assert_eq!(written(|o| float(o, w)), serde_json::to_string(&w).unwrap());
            let d = Duration::from_nanos(nanos);
            prop_assert_eq!(
                written(|o| secs(o, d)),
                serde_json::to_string(&sluice_http::admin::secs(d)).unwrap()
            );
        }
    }

    /// Whole numbers, where `float` skips the float formatter, are written as serde_json
    /// writes them: at the bound's edges, every power of ten, and below zero.
    #[test]
    fn whole_numbers_are_written_as_serde_json_writes_them() {
        let mut cases: Vec<f64> = vec![0.0, -0.0, 1.0, 59.0, 60.0, 3_600.0, 86_400.0, -1.0];
        cases.extend([
            WHOLE_BELOW - 1.0,
            WHOLE_BELOW,
            WHOLE_BELOW + 1.0,
            3_153_600_000.0,
        ]);
        cases.extend((0..20).map(|e| 10f64.powi(e)));
        for f in cases {
            assert_eq!(
                written(|o| float(o, f)),
                serde_json::to_string(&f).unwrap(),
                "{f}"
            );
        }
    }

    /// A policy described twice in a row, after another, or after more than a thread keeps,
    /// reads the same as its `Display`.
    #[test]
    fn descriptions_are_the_policies_display() {
        use sluice_core::{Gcra, Rate, TokenBucket};
        let a = Policy::from(TokenBucket::new(10, Rate::per_second(5)).unwrap());
        let b = Policy::from(Gcra::new(Rate::per_minute(100), 3).unwrap());
        let many: Vec<Policy> = (1..=2 * DESCRIBED_KEPT as u64)
            .map(|n| Policy::from(TokenBucket::new(n, Rate::per_second(n)).unwrap()))
            .collect();
        let order = [&a, &a, &b, &a, &b, &b]
            .into_iter()
            .chain(&many)
            .chain([&a, &many[0]]);
        for p in order {
            assert_eq!(
                written(|o| description(o, p)),
                serde_json::to_string(&p.to_string()).unwrap()
            );
        }
    }

    #[test]
    fn never_is_null() {
        assert_eq!(written(|o| secs(o, Decision::NEVER)), "null");
        assert_eq!(written(|o| boolean(o, true)), "true");
    }
}
