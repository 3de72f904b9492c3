//! Durations written the way operators write them: `500ms`, `30s`, `15m`, `36h`, `7d`, `1w`, or
//! a sum such as `1h30m`.
//!
//! One parser for every place Sluice reads a duration, a rule file's `window` as much as a
//! command line's `--duration`, so the same text means the same length everywhere.
//!
//! ```
//! use std::time::Duration;
//! use sluice_core::{parse_duration, parse_duration_or_error};
//!
//! assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
//! assert_eq!(parse_duration("1.5h"), None);
//! assert_eq!(
//!     parse_duration_or_error("90 minutes").unwrap_err(),
//!     "`90 minutes` is not a duration such as 500ms, 10s, 15m, 1h30m or 7d"
//! );
//! ```

use std::time::Duration;

/// Parses a duration: whole numbers, each followed by a unit (`ms`, `s`, `m`, `h`, `d` or `w`),
/// summed. `None` if the text is not one, or is too long to hold. Zero is returned as zero:
/// whether it is allowed is the caller's decision, which says so in its own words.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let amount: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit_nanos: u64 = match &rest[..unit_len] {
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            "w" => 604_800_000_000_000,
            _ => return None,
        };
        rest = &rest[unit_len..];
        let nanos = amount.checked_mul(unit_nanos)?;
        total = total.checked_add(Duration::from_nanos(nanos))?;
    }
    Some(total)
}

/// [`parse_duration`], with an error a person can act on: it names the text and shows the forms
/// a duration takes. It fits clap's `value_parser` as it is.
pub fn parse_duration_or_error(text: &str) -> Result<Duration, String> {
    parse_duration(text)
        .ok_or_else(|| format!("`{text}` is not a duration such as 500ms, 10s, 15m, 1h30m or 7d"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_sums() {
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("15m"), Some(Duration::from_secs(900)));
        assert_eq!(parse_duration("36h"), Some(Duration::from_secs(36 * 3600)));
        assert_eq!(parse_duration("7d"), Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("1w"), Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
    }

    #[test]
    fn garbage_is_none() {
        for bad in [
            "",
            "s",
            "10",
            "10x",
            "1.5s",
            "-1s",
            "10 s",
            "99999999999999999999s",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        assert_eq!(parse_duration("18446744073709551615w"), None);
    }

    #[test]
    fn the_error_names_the_text_and_shows_examples() {
        assert_eq!(
            parse_duration_or_error(" 1h "),
            Ok(Duration::from_secs(3600))
        );
        for bad in ["", "10", "1.5s", "ten seconds"] {
            assert_eq!(
                parse_duration_or_error(bad),
                Err(format!(
                    "`{bad}` is not a duration such as 500ms, 10s, 15m, 1h30m or 7d"
                )),
            );
        }
    }
}
