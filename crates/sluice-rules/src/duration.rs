//! Window lengths written the way operators write them: `500ms`, `30s`, `15m`, `36h`, `7d`, `1w`,
//! or a sum such as `1h30m`.

use std::time::Duration;

/// Parses a duration, or `None` if the text is not one. Zero is returned as zero: whether it is
/// allowed is the algorithm's decision, which says so in its own words.
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
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
}
