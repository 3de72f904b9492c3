//! The `Date` of an HTTP answer (RFC 9110 §6.6.1), formatted once a second per thread.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

thread_local! {
    /// The second last formatted, and its IMF-fixdate.
    static CACHED: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// Appends the current time as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) to `out`.
pub(crate) fn now(out: &mut Vec<u8>) {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with_borrow_mut(|(at, text)| {
        if *at != second {
            *at = second;
            *text = httpdate::fmt_http_date(now);
        }
        out.extend_from_slice(text.as_bytes());
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_date_is_an_imf_fixdate_of_now() {
        let mut out = Vec::new();
        now(&mut out);
        let text = std::str::from_utf8(&out).unwrap();
        assert_eq!(text.len(), 29, "{text}");
        assert!(text.ends_with(" GMT"), "{text}");
        let parsed = httpdate::parse_http_date(text).unwrap();
        let age = SystemTime::now().duration_since(parsed).unwrap();
        assert!(age.as_secs() < 5, "{text} is {age:?} old");
    }
}
