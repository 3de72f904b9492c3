//! Script replies as decisions.

use std::time::Duration;

use sluice_core::{Decision, StoreError};

/// One check's reply from the check script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    /// The decision.
    pub(crate) decision: Decision,
    /// What identifies the consumed units for a refund (empty when nothing was consumed).
    pub(crate) token: String,
}

/// Decodes the check script's reply for checks with these `limits`, in order: six fields per
/// check in one string (see [`CHECK`](super::CHECK)).
pub(crate) fn decode_replies(
    value: redis::Value,
    limits: impl ExactSizeIterator<Item = u64>,
) -> Result<Vec<Reply>, StoreError> {
    let bad = |what: &str| {
        StoreError::Rejected(format!(
            "the check script answered {what}; is another program using this key prefix?"
        ))
    };
    let redis::Value::BulkString(text) = value else {
        return Err(bad("something other than a string"));
    };
    let mut fields = text.split(|b| *b == b' ');
    let mut replies = Vec::with_capacity(limits.len());
    for limit in limits {
        let mut field = || fields.next().ok_or_else(|| bad("too few values"));
        let mut int =
            || integer(field()?).ok_or_else(|| bad("a non-integer where an integer belongs"));
        let nanos = |i: i64| Duration::from_nanos(u64::try_from(i).unwrap_or(0));
        let allowed = int()? == 1;
        let remaining = u64::try_from(int()?).unwrap_or(0);
        let reset_after = nanos(int()?);
        let retry = int()?;
        let delay = nanos(int()?);
        let token = match field()? {
            b"-" => String::new(),
            t => String::from_utf8_lossy(t).into_owned(),
        };
        let decision = Decision {
            allowed,
            limit,
            remaining,
            reset_after,
            retry_after: if retry < 0 {
                Decision::NEVER
            } else {
                nanos(retry)
            },
            delay,
        };
        replies.push(Reply { decision, token });
    }
    if fields.next().is_some() {
        return Err(bad("too many values"));
    }
    Ok(replies)
}

/// `field` as a decimal integer (digits, after a `-` if negative), as Lua writes one.
fn integer(field: &[u8]) -> Option<i64> {
    let (negative, digits) = match field.split_first() {
        Some((b'-', digits)) => (true, digits),
        _ => (false, field),
    };
    if digits.is_empty() {
        return None;
    }
    // Counted below zero, where i64 reaches one further.
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_sub(i64::from(d - b'0'))?;
    }
    if negative { Some(n) } else { n.checked_neg() }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Whatever the field, it reads as the standard parser reads it, but for a `+` sign,
        /// which Lua never writes.
        #[test]
        fn integers_read_as_the_standard_parser_reads_them(field in "[-+]?[0-9a]{0,21}") {
            let expected = field.parse::<i64>().ok().filter(|_| !field.starts_with('+'));
            proptest::prop_assert_eq!(integer(field.as_bytes()), expected);
        }
    }

    #[test]
    fn the_extremes_read_whole() {
        for n in [0, -1, i64::MAX, i64::MIN] {
            assert_eq!(integer(n.to_string().as_bytes()), Some(n));
        }
        for field in [
            "",
            "-",
            "9223372036854775808",
            "-9223372036854775809",
            "1-",
            " 1",
        ] {
            assert_eq!(integer(field.as_bytes()), None, "{field}");
        }
    }
}
