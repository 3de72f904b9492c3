//! What envoyproxy/ratelimit adds to an answer by settings of the whole service, applied to a
//! [`RateLimitResponse`] after it is made from the verdict: the rate-limit headers of
//! `LIMIT_RESPONSE_HEADERS_ENABLED`, and the global shadow mode of `SHADOW_MODE`. The gRPC
//! service and `/json` both finish their answer here, so they cannot drift apart.

use std::cmp::Reverse;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use sluice_limiter::tightest;

use crate::envoy::{Code, DescriptorStatus, RateLimitResponse};

/// Service-wide settings of the Envoy surfaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvoyAnswers {
    /// Answer `OK` whenever the answer would be `OVER_LIMIT`, keeping each descriptor's own
    /// status (envoyproxy/ratelimit's `SHADOW_MODE`): a whole deployment tried out before it
    /// enforces.
    pub shadow_mode: bool,
    /// Ask Envoy to add these headers, describing the descriptor closest to its limit.
    pub limit_headers: Option<LimitHeaderNames>,
    /// Every limit is a quota limit (envoyproxy/ratelimit's `QUOTA_MODE`): a request is refused
    /// only when every descriptor with a limit refuses it.
    pub quota_mode: bool,
    /// Return the request and the passed descriptors' rule `metadata` in the answer's dynamic
    /// metadata (envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA`).
    pub dynamic_metadata: bool,
    /// `/healthcheck` fails while no domain is loaded (envoyproxy/ratelimit's
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`), as it may be with rules over xDS.
    pub healthy_needs_rules: bool,
}

/// The names of the three rate-limit headers (envoyproxy/ratelimit's `LIMIT_LIMIT_HEADER`,
/// `LIMIT_REMAINING_HEADER` and `LIMIT_RESET_HEADER`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitHeaderNames {
    /// The limit's requests per unit.
    pub limit: String,
    /// What remains of it.
    pub remaining: String,
    /// Whole seconds until it resets.
    pub reset: String,
}

impl Default for LimitHeaderNames {
    fn default() -> Self {
        LimitHeaderNames {
            limit: "RateLimit-Limit".to_owned(),
            remaining: "RateLimit-Remaining".to_owned(),
            reset: "RateLimit-Reset".to_owned(),
        }
    }
}

impl EnvoyAnswers {
    /// Adds the headers, then applies the shadow mode, as envoyproxy/ratelimit does: the
    /// headers still describe the limit that would have refused. Whether the shadow mode
    /// turned the answer from `OVER_LIMIT` to `OK`, which Envoy's statistics count.
    pub fn finish(&self, response: &mut RateLimitResponse) -> bool {
        if let Some(names) = &self.limit_headers {
            response
                .response_headers_to_add
                .extend(limit_headers(response, names));
        }
        let shadowed = self.shadow_mode && response.overall_code == Code::OverLimit as i32;
        if shadowed {
            response.overall_code = Code::Ok as i32;
        }
        shadowed
    }
}

/// The three headers for the descriptor closest to its limit, by envoyproxy/ratelimit's order
/// ([`closeness`]). None when no descriptor has a limit.
fn limit_headers(response: &RateLimitResponse, names: &LimitHeaderNames) -> Vec<HeaderValue> {
    let with_limit = response
        .statuses
        .iter()
        .enumerate()
        .filter(|(_, s)| s.current_limit.is_some());
    let Some((_, status)) = tightest(with_limit, |(i, s)| closeness(*i, s)) else {
        return Vec::new();
    };
    let limit = status
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    let reset = status
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds.max(0));
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        ..Default::default()
    };
    vec![
        header(&names.limit, limit.to_string()),
        header(&names.remaining, status.limit_remaining.to_string()),
        header(&names.reset, reset.to_string()),
    ]
}

/// How close the status of descriptor `i` is to its limit, larger meaning closer, as
/// envoyproxy/ratelimit orders them for its headers: a refused descriptor, the later the closer
/// (Envoy keeps the last one), then the fewer remaining (the first of equals, as every
/// [`tightest`] keeps).
fn closeness(i: usize, status: &DescriptorStatus) -> impl Ord + use<> {
    let refused = status.code == Code::OverLimit as i32;
    (
        refused,
        refused.then_some(i),
        Reverse(status.limit_remaining),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::{DescriptorStatus, RateLimit};

    fn status(code: Code, limit: Option<u32>, remaining: u32, reset: i64) -> DescriptorStatus {
        DescriptorStatus {
            code: code as i32,
            current_limit: limit.map(|n| RateLimit {
                requests_per_unit: n,
                ..Default::default()
            }),
            limit_remaining: remaining,
            duration_until_reset: Some(prost_types_duration(reset)),
            ..Default::default()
        }
    }

    fn prost_types_duration(seconds: i64) -> envoy_types::pb::google::protobuf::Duration {
        envoy_types::pb::google::protobuf::Duration { seconds, nanos: 0 }
    }

    fn headers(r: &RateLimitResponse) -> Vec<(String, String)> {
        r.response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect()
    }

    fn answers(shadow_mode: bool) -> EnvoyAnswers {
        EnvoyAnswers {
            shadow_mode,
            limit_headers: Some(LimitHeaderNames::default()),
            healthy_needs_rules: false,
            dynamic_metadata: false,
            quota_mode: false,
        }
    }

    #[test]
    fn the_headers_describe_the_refused_descriptor_else_the_closest() {
        let mut r = RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![
                status(Code::Ok, Some(100), 40, 30),
                status(Code::Ok, None, u32::MAX, 0),
                status(Code::Ok, Some(10), 3, 50),
            ],
            ..Default::default()
        };
        answers(false).finish(&mut r);
        let expected = [
            ("RateLimit-Limit", "10"),
            ("RateLimit-Remaining", "3"),
            ("RateLimit-Reset", "50"),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(headers(&r), expected);

        let mut r = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![
                status(Code::Ok, Some(10), 0, 5),
                status(Code::OverLimit, Some(1000), 0, 3600),
            ],
            ..Default::default()
        };
        answers(true).finish(&mut r);
        assert_eq!(headers(&r)[0].1, "1000");
        assert_eq!(headers(&r)[2].1, "3600");
        // The shadow mode answers OK, and each descriptor keeps its status.
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
    }

    #[test]
    fn no_limit_no_headers_and_no_shadow_mode_changes_nothing() {
        let mut r = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![status(Code::Ok, None, u32::MAX, 0)],
            ..Default::default()
        };
        let before = r.clone();
        EnvoyAnswers::default().finish(&mut r);
        assert_eq!(r, before);
        answers(false).finish(&mut r);
        assert!(r.response_headers_to_add.is_empty());
        assert_eq!(r.overall_code, Code::OverLimit as i32);
    }
}
