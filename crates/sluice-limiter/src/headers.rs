//! The rate-limit response fields: the IETF `RateLimit-Policy` and `RateLimit` fields, the
//! legacy `X-RateLimit-*` trio, and `Retry-After`.

use std::cell::RefCell;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use http::header::{HeaderName, RETRY_AFTER};
use sluice_core::Decision;
use sluice_rules::Rule;

use crate::verdict::{LimitResult, tightest};

/// Which rate-limit fields an answer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderStyle {
    /// The IETF `RateLimit-Policy` and `RateLimit` structured fields.
    #[default]
    Ietf,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`, as many clients
    /// still expect.
    Legacy,
    /// Both sets.
    Both,
    /// Neither; a refusal still carries `Retry-After`.
    None,
}

impl FromStr for HeaderStyle {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ietf" => Ok(HeaderStyle::Ietf),
            "legacy" => Ok(HeaderStyle::Legacy),
            "both" => Ok(HeaderStyle::Both),
            "none" => Ok(HeaderStyle::None),
            other => Err(format!(
                "unknown header style `{other}`; expected ietf, legacy, both or none"
            )),
        }
    }
}

// The names, checked once rather than on every answer; cloning a static name copies a pointer.
static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Whole seconds, rounded up, so a client that waits that long is never early.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The `Retry-After` value for a refusal: whole seconds, at least 1. `None` when the request can
/// never pass (its cost exceeds the limit), where any number would mislead.
pub fn retry_after_secs(decision: &Decision) -> Option<u64> {
    if decision.allowed || decision.is_permanent_denial() {
        return None;
    }
    Some(ceil_secs(decision.retry_after).max(1))
}

/// The bytes a structured-field string holds as themselves: printable ASCII but the quote and
/// the backslash. A table, as every answer checks its limits' names against it.
static SF_PLAIN: [bool; 256] = {
    let mut plain = [false; 256];
    let mut b = b' ';
    while b <= b'~' {
        plain[b as usize] = b != b'"' && b != b'\\';
        b += 1;
    }
    plain
};

/// Writes `name` as a structured-field string: quotes and backslashes escaped, anything outside
/// printable ASCII replaced, so a rule name can never break the header.
fn push_sf_string(out: &mut String, name: &str) {
    out.push('"');
    // Rule names rarely need escaping: copy them whole when they don't.
    if name.bytes().all(|b| SF_PLAIN[usize::from(b)]) {
        out.push_str(name);
        out.push('"');
        return;
    }
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
}

/// The headers for a request that `shown` limits applied to, in `style`. The legacy fields
/// describe the tightest limit, by the one ordering the verdict uses too; the IETF fields list
/// every one. A refusal also gets `Retry-After`. `shown` is walked more than once rather than
/// collected: these are built for every answer.
pub(crate) fn rate_limit_headers<'a>(
    shown: impl Iterator<Item = &'a LimitResult> + Clone,
    style: HeaderStyle,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::with_capacity(4);
    let Some(tightest) = tightest(shown.clone(), |l| l.restriction()) else {
        return out;
    };
    if matches!(style, HeaderStyle::Ietf | HeaderStyle::Both) {
        // Written in this thread's scratch strings and copied out at their length: one
        // allocation for each value, where a string of its own and the `Bytes` that took it
        // over cost two (these are built for every answer).
        SCRATCH.with_borrow_mut(|scratch| {
            let Scratch {
                policy,
                state,
                policy_quotas,
                policy_value,
            } = scratch;
            // The policy field says only what the rules say: the same as the last answer's
            // when the same rules apply with the same quotas, and then shared, not written
            // again. The rules are held, so none of them can be another at the same address.
            let same = policy_quotas.len() == shown.clone().count()
                && policy_quotas
                    .iter()
                    .zip(shown.clone())
                    .all(|((rule, quota), l)| {
                        Arc::ptr_eq(rule, &l.rule) && *quota == l.decision.limit
                    });
            match policy_value {
                Some(value) if same => out.push((RATELIMIT_POLICY.clone(), value.clone())),
                _ => {
                    policy.clear();
                    for (i, l) in shown.clone().enumerate() {
                        if i > 0 {
                            policy.push_str(", ");
                        }
                        push_sf_string(policy, l.name());
                        policy.push_str(";q=");
                        push_u64(policy, l.decision.limit);
                        if l.policy().concurrent() {
                            // A quota of requests at once has no window (IETF draft-11's quota
                            // unit).
                            policy.push_str(";qu=\"concurrent-requests\"");
                        } else {
                            policy.push_str(";w=");
                            push_u64(policy, ceil_secs(l.policy().window()));
                        }
                    }
                    push(&mut out, &RATELIMIT_POLICY, policy);
                    // Kept in the same vector: answers whose rules change each time (a
                    // per-request override is a rule of its own) allocate nothing for it.
                    policy_quotas.clear();
                    policy_quotas.extend(
                        shown
                            .clone()
                            .map(|l| (Arc::clone(&l.rule), l.decision.limit)),
                    );
                    *policy_value = out.last().map(|(_, value)| value.clone());
                }
            }
            state.clear();
            for (i, l) in shown.enumerate() {
                if i > 0 {
                    state.push_str(", ");
                }
                push_sf_string(state, l.name());
                state.push_str(";r=");
                push_u64(state, l.decision.remaining);
                state.push_str(";t=");
                push_u64(state, ceil_secs(l.decision.reset_after));
            }
            push(&mut out, &RATELIMIT, state);
        });
    }
    if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
        let d = &tightest.decision;
        push_number(&mut out, &X_RATELIMIT_LIMIT, d.limit);
        push_number(&mut out, &X_RATELIMIT_REMAINING, d.remaining);
        push_number(&mut out, &X_RATELIMIT_RESET, ceil_secs(d.reset_after));
    }
    if let Some(secs) = retry_after_secs(&tightest.decision).filter(|_| tightest.enforced()) {
        out.push((RETRY_AFTER, HeaderValue::from(secs)));
    }
    out
}

/// A rule and the quota it answered with: what a `RateLimit-Policy` value says.
type Quota = (Arc<Rule>, u64);

/// Where the IETF fields' values are written before they are copied out, and the last
/// `RateLimit-Policy` value with the rules and quotas it was written for.
struct Scratch {
    policy: String,
    state: String,
    /// The rules and quotas of [`Scratch::policy_value`].
    policy_quotas: Vec<Quota>,
    /// The last `RateLimit-Policy` value; `None` before the first.
    policy_value: Option<HeaderValue>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch {
            policy: String::new(),
            state: String::new(),
            policy_quotas: Vec::new(),
            policy_value: None,
        })
    };
}

/// Writes `n` in decimal, as `Display` does, without going through a formatter.
fn push_u64(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

fn push(out: &mut Vec<(HeaderName, HeaderValue)>, name: &HeaderName, value: &str) {
    // Every value built here is printable ASCII, so the conversion cannot fail; skip rather
    // than panic should that ever change. Copied at its length, the value's `Bytes` needs no
    // shared header of its own.
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::copy_from_slice(value.as_bytes())) {
        out.push((name.clone(), v));
    }
}

fn push_number(out: &mut Vec<(HeaderName, HeaderValue)>, name: &HeaderName, n: u64) {
    out.push((name.clone(), HeaderValue::from(n)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Outcome;
    use crate::verdict::tests_support::rule;
    use sluice_core::{Alignment, FixedWindow, Policy, Rate, TokenBucket};
    use sluice_rules::Mode;

    /// An enforced limit named `name` of `policy` that decided `decision`.
    fn limit(name: &str, policy: &Policy, decision: &Decision) -> LimitResult {
        LimitResult {
            descriptor: 0,
            key: name.to_owned(),
            rule: rule(name, policy.clone(), Mode::Enforce),
            decision: *decision,
            outcome: Outcome::Allowed,
        }
    }

    fn decision(allowed: bool, remaining: u64, reset_ms: u64, retry_ms: u64) -> Decision {
        Decision {
            allowed,
            limit: 10,
            remaining,
            reset_after: Duration::from_millis(reset_ms),
            retry_after: Duration::from_millis(retry_ms),
            delay: Duration::ZERO,
        }
    }

    /// A rule name is a structured-field string whatever it holds: quotes and backslashes
    /// escaped, anything outside printable ASCII replaced, a plain name copied as it is.
    #[test]
    fn rule_names_are_quoted_and_escaped() {
        let quoted = |name: &str| {
            let mut out = String::new();
            push_sf_string(&mut out, name);
            out
        };
        assert_eq!(quoted("per-user 10/s"), r#""per-user 10/s""#);
        assert_eq!(quoted(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(quoted("é\tx~"), r#""??x~""#);
        assert_eq!(quoted(""), r#""""#);
    }

    /// A rate is advertised as its whole limit over the time the rate takes to grant it, in
    /// whole seconds rounded up: a client pacing itself by `q` over `w` is never too fast.
    #[test]
    fn a_rate_with_a_burst_is_advertised_over_the_time_to_grant_the_burst() {
        let bucket = Policy::from(TokenBucket::new(40, Rate::per_second(20)).unwrap());
        let odd = Policy::from(TokenBucket::new(10, Rate::per_second(3)).unwrap());
        let (full, other) = (
            Decision {
                limit: 40,
                ..decision(true, 39, 50, 0)
            },
            decision(true, 9, 50, 0),
        );
        let shown = [limit("bucket", &bucket, &full), limit("odd", &odd, &other)];
        let headers = rate_limit_headers(shown.iter(), HeaderStyle::Ietf);
        assert_eq!(
            headers[0].1.to_str().unwrap(),
            r#""bucket";q=40;w=2, "odd";q=10;w=4"#
        );
    }

    #[test]
    fn ietf_fields_list_every_quota_and_legacy_the_tightest() {
        let burst = Policy::from(TokenBucket::new(10, Rate::per_second(10)).unwrap());
        let day = Policy::from(
            FixedWindow::new(10, Duration::from_secs(86_400), Alignment::FirstRequest).unwrap(),
        );
        let (a, b) = (
            decision(true, 9, 100, 0),
            decision(false, 0, 7_200_000, 3_600_500),
        );
        let quotas = [limit("burst", &burst, &a), limit("da\"y", &day, &b)];
        let headers = rate_limit_headers(quotas.iter(), HeaderStyle::Both);
        let get = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.to_str().unwrap().to_owned())
        };
        assert_eq!(
            get("ratelimit-policy").unwrap(),
            r#""burst";q=10;w=1, "da\"y";q=10;w=86400"#
        );
        assert_eq!(
            get("ratelimit").unwrap(),
            r#""burst";r=9;t=1, "da\"y";r=0;t=7200"#
        );
        assert_eq!(get("x-ratelimit-remaining").unwrap(), "0");
        assert_eq!(get("x-ratelimit-reset").unwrap(), "7200");
        assert_eq!(get("retry-after").unwrap(), "3601");
    }

    /// A concurrency limit's quota is of requests at once: it says so, and has no window.
    #[test]
    fn a_concurrency_limit_is_a_quota_of_concurrent_requests() {
        let slots =
            Policy::from(sluice_core::ConcurrencyLimit::new(10, Duration::from_secs(300)).unwrap());
        let minute = Policy::from(
            FixedWindow::new(10, Duration::from_secs(60), Alignment::FirstRequest).unwrap(),
        );
        let (a, b) = (
            decision(false, 0, 300_000, 1_000),
            decision(true, 9, 100, 0),
        );
        let shown = [limit("slots", &slots, &a), limit("minute", &minute, &b)];
        let headers = rate_limit_headers(shown.iter(), HeaderStyle::Ietf);
        assert_eq!(
            headers[0].1.to_str().unwrap(),
            r#""slots";q=10;qu="concurrent-requests", "minute";q=10;w=60"#
        );
    }

    /// The policy field is reused while the same limits apply, and rebuilt as soon as they
    /// differ: by name, by quota or by window.
    #[test]
    fn the_policy_field_follows_the_limits_that_apply() {
        let minute = |n| {
            Policy::from(
                FixedWindow::new(n, Duration::from_secs(60), Alignment::FirstRequest).unwrap(),
            )
        };
        let hour = Policy::from(
            FixedWindow::new(10, Duration::from_secs(3_600), Alignment::FirstRequest).unwrap(),
        );
        let d = decision(true, 9, 100, 0);
        let policy_of = |l: LimitResult| {
            let headers = rate_limit_headers([l].iter(), HeaderStyle::Ietf);
            headers[0].1.to_str().unwrap().to_owned()
        };
        let ten = minute(10);
        for _ in 0..2 {
            assert_eq!(policy_of(limit("a", &ten, &d)), r#""a";q=10;w=60"#);
        }
        assert_eq!(policy_of(limit("b", &ten, &d)), r#""b";q=10;w=60"#);
        let five = Decision { limit: 5, ..d };
        assert_eq!(policy_of(limit("b", &minute(5), &five)), r#""b";q=5;w=60"#);
        assert_eq!(policy_of(limit("b", &hour, &d)), r#""b";q=10;w=3600"#);
        assert_eq!(policy_of(limit("a", &ten, &d)), r#""a";q=10;w=60"#);

        // One rule answering again: the same field, until its quota or the limits change.
        let a = limit("a", &ten, &d);
        let again = |l: &LimitResult| policy_of(l.clone());
        assert_eq!(again(&a), r#""a";q=10;w=60"#);
        assert_eq!(again(&a), r#""a";q=10;w=60"#);
        let mut fewer = a.clone();
        fewer.decision.limit = 7;
        assert_eq!(again(&fewer), r#""a";q=7;w=60"#);
        assert_eq!(again(&a), r#""a";q=10;w=60"#);
        let both = [a.clone(), limit("c", &hour, &d)];
        let field = rate_limit_headers(both.iter(), HeaderStyle::Ietf);
        assert_eq!(field[0].1, r#""a";q=10;w=60, "c";q=10;w=3600"#);
        assert_eq!(again(&a), r#""a";q=10;w=60"#);
    }

    #[test]
    fn numbers_are_written_as_display_writes_them() {
        for n in [0, 7, 10, 99, 100, 86_400, 1_000_000_007, u64::MAX] {
            let mut out = String::new();
            push_u64(&mut out, n);
            assert_eq!(out, n.to_string());
        }
    }

    #[test]
    fn no_quota_means_no_fields_and_never_means_no_retry_after() {
        assert!(rate_limit_headers([].iter(), HeaderStyle::Both).is_empty());
        let p = Policy::from(TokenBucket::new(1, Rate::per_second(1)).unwrap());
        let never = Decision {
            retry_after: Decision::NEVER,
            ..decision(false, 0, 0, 0)
        };
        let headers = rate_limit_headers([limit("x", &p, &never)].iter(), HeaderStyle::None);
        assert!(headers.is_empty());
        assert_eq!(
            "legacy".parse::<HeaderStyle>().unwrap(),
            HeaderStyle::Legacy
        );
        assert!("bogus".parse::<HeaderStyle>().is_err());
    }
}
