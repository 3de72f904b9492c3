//! RFC 3339 times, as the admin API reads an override's `expires` and writes when it was set:
//! `2026-12-31T00:00:00Z`, with an optional fraction of a second and any UTC offset. Dates are
//! converted with the proleptic Gregorian calendar (Howard Hinnant's `days_from_civil`), so no
//! time zone database is needed: RFC 3339 carries its offset.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Days from 1970-01-01 to `y-m-d`.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date `(y, m, d)` `days` after 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

/// Reads an RFC 3339 time, such as `2026-12-31T00:00:00Z` or `2026-12-31T01:30:00.5+01:30`.
/// `None` for anything else, or a time before 1970.
pub(crate) fn parse(text: &str) -> Option<SystemTime> {
    let b = text.as_bytes();
    let digits = |from: usize, len: usize| -> Option<i64> {
        let part = text.get(from..from + len)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (digits(0, 4)?, digits(5, 2)?, digits(8, 2)?);
    let (h, mi, s) = (digits(11, 2)?, digits(14, 2)?, digits(17, 2)?);
    let days_in_month = match mo {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if y % 4 == 0 && (y % 100 != 0 || y % 400 == 0) => 29,
        2 => 28,
        _ => return None,
    };
    if d < 1 || d > days_in_month || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut at = 19;
    let mut nanos = 0u32;
    if b.get(at) == Some(&b'.') {
        at += 1;
        let start = at;
        while b.get(at).is_some_and(u8::is_ascii_digit) {
            at += 1;
        }
        let fraction = &text[start..at];
        if fraction.is_empty() {
            return None;
        }
        let mut padded: String = fraction.chars().take(9).collect();
        while padded.len() < 9 {
            padded.push('0');
        }
        nanos = padded.parse().ok()?;
    }
    let offset = match &text[at..] {
        "Z" | "z" => 0,
        zone => {
            let zb = zone.as_bytes();
            if zb.len() != 6 || zb[3] != b':' {
                return None;
            }
            let sign = match zb[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (oh, om) = (digits(at + 1, 2)?, digits(at + 4, 2)?);
            if oh > 23 || om > 59 {
                return None;
            }
            sign * (oh * 3600 + om * 60)
        }
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - offset;
    let secs = u64::try_from(secs).ok()?;
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

/// Writes `at` in UTC, to the second: `2026-12-31T00:00:00Z`.
pub(crate) fn format(at: SystemTime) -> String {
    let secs = at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_and_write_back() {
        let at = parse("2026-12-31T00:00:00Z").unwrap();
        assert_eq!(
            at.duration_since(UNIX_EPOCH).unwrap().as_secs(),
            1_798_675_200
        );
        assert_eq!(format(at), "2026-12-31T00:00:00Z");
        let offset = parse("2026-12-31T01:30:00.5+01:30").unwrap();
        assert_eq!(
            offset.duration_since(UNIX_EPOCH).unwrap(),
            Duration::new(1_798_675_200, 500_000_000)
        );
        assert_eq!(
            format(parse("2024-02-29T23:59:59Z").unwrap()),
            "2024-02-29T23:59:59Z"
        );
    }

    #[test]
    fn malformed_times_are_refused() {
        for bad in [
            "",
            "2026-12-31",
            "2026-13-01T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-12-31T00:00:00",
            "2026-12-31T24:00:00Z",
            "2026-12-31T00:00:00+0100",
            "2026-12-31T00:00:00.Z",
            "1969-12-31T23:59:59Z",
            "tomorrow at noon",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
