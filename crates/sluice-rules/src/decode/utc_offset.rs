//! A fixed window's `utc_offset`: where its clock-aligned windows start, as `+03:00`, `-05:30`,
//! `+0300`, `Z`, `UTC` or a number of seconds.

use super::Decoder;
use crate::error::ErrorKind;
use crate::yaml::{Node, NodeKind};

/// The largest UTC offset accepted, in seconds: real zones span -12:00 to +14:00.
const MAX_UTC_OFFSET_SECS: i64 = 18 * 3600;

impl Decoder {
    pub(super) fn utc_offset(&mut self, node: &Node) -> Option<i32> {
        let NodeKind::Scalar { text, plain } = &node.kind else {
            self.wrong_type("utc_offset", node, "an offset such as +03:00");
            return None;
        };
        let secs = match text.parse::<i64>() {
            Ok(n) if *plain => Some(n),
            _ => parse_utc_offset(text),
        };
        match secs {
            Some(s) if s.abs() <= MAX_UTC_OFFSET_SECS => i32::try_from(s).ok(),
            _ => {
                let kind = ErrorKind::InvalidUtcOffset {
                    value: text.clone(),
                };
                self.error(node, kind);
                None
            }
        }
    }
}

/// `+03:00`, `-05:30`, `+0300`, `Z` or `UTC`, in seconds east of UTC.
fn parse_utc_offset(text: &str) -> Option<i64> {
    if matches!(text, "Z" | "z" | "UTC") {
        return Some(0);
    }
    if !text.is_ascii() {
        return None;
    }
    let (sign, rest) = match text.as_bytes().first()? {
        b'+' => (1, &text[1..]),
        b'-' => (-1, &text[1..]),
        _ => return None,
    };
    let (h, m) = match rest.split_once(':') {
        Some((h, m)) => (h, m),
        None if rest.len() == 4 => rest.split_at(2),
        None => (rest, "0"),
    };
    if h.is_empty() || h.len() > 2 || m.len() > 2 {
        return None;
    }
    let h: i64 = h.parse().ok()?;
    let m: i64 = m.parse().ok()?;
    (m < 60).then_some(sign * (h * 3600 + m * 60))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_offsets() {
        assert_eq!(parse_utc_offset("+03:00"), Some(10_800));
        assert_eq!(parse_utc_offset("-05:30"), Some(-19_800));
        assert_eq!(parse_utc_offset("+0530"), Some(19_800));
        assert_eq!(parse_utc_offset("+3"), Some(10_800));
        assert_eq!(parse_utc_offset("Z"), Some(0));
        assert_eq!(parse_utc_offset("03:00"), None);
        assert_eq!(parse_utc_offset("+03:75"), None);
        assert_eq!(parse_utc_offset("+"), None);
    }
}
