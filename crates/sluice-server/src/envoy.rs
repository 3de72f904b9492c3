//! Envoy's rate-limit protocol types, and the mapping between them and a [`Verdict`].
//!
//! Shared by the gRPC service and the HTTP `/json` endpoint, which carries the same messages in
//! JSON, so the two cannot drift apart.

use std::time::Duration;

pub use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse,
    rate_limit_response::{Code, DescriptorStatus, RateLimit, rate_limit::Unit as EnvoyUnit},
};
use sluice_rules::Unit;

use sluice_limiter::limits::MAX_DESCRIPTORS;
use sluice_limiter::{LimitOverride, LimitRequest, LimitResult, RequestDescriptor, Verdict};

/// The Envoy unit whose length is exactly `window`, or `Unknown` for Sluice's free windows.
pub fn envoy_unit(window: Duration) -> EnvoyUnit {
    match Unit::ALL.into_iter().find(|u| u.duration() == window) {
        Some(Unit::Second) => EnvoyUnit::Second,
        Some(Unit::Minute) => EnvoyUnit::Minute,
        Some(Unit::Hour) => EnvoyUnit::Hour,
        Some(Unit::Day) => EnvoyUnit::Day,
        Some(Unit::Week) => EnvoyUnit::Week,
        Some(Unit::Month) => EnvoyUnit::Month,
        Some(Unit::Year) => EnvoyUnit::Year,
        None => EnvoyUnit::Unknown,
    }
}

fn unit_from_envoy(unit: i32) -> Option<Unit> {
    Some(match EnvoyUnit::try_from(unit).ok()? {
        EnvoyUnit::Second => Unit::Second,
        EnvoyUnit::Minute => Unit::Minute,
        EnvoyUnit::Hour => Unit::Hour,
        EnvoyUnit::Day => Unit::Day,
        EnvoyUnit::Week => Unit::Week,
        EnvoyUnit::Month => Unit::Month,
        EnvoyUnit::Year => Unit::Year,
        EnvoyUnit::Unknown => return None,
    })
}

/// A protocol request as a [`LimitRequest`]. `hits_addend` 0 or unset counts as 1, as the proto
/// says; a descriptor's own `hits_addend`, when present, overrides it, and a present 0 checks
/// without consuming.
pub fn to_limit_request(req: RateLimitRequest) -> Result<LimitRequest, String> {
    let mut descriptors = Vec::with_capacity(req.descriptors.len().min(MAX_DESCRIPTORS));
    for (i, d) in req.descriptors.into_iter().enumerate() {
        let limit_override = match d.limit {
            Some(o) => Some(LimitOverride {
                requests_per_unit: u64::from(o.requests_per_unit),
                unit: unit_from_envoy(o.unit).ok_or_else(|| {
                    format!(
                        "`descriptors[{i}].limit.unit` is {}, not a known unit",
                        o.unit
                    )
                })?,
            }),
            None => None,
        };
        descriptors.push(RequestDescriptor {
            entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
            envoy_hits: d.hits_addend.is_some(),
            cost: d.hits_addend.map(|h| h.value),
            limit_override,
            refund: d.is_negative_hits,
        });
    }
    Ok(LimitRequest {
        domain: req.domain,
        descriptors,
        cost: u64::from(req.hits_addend).max(1),
    })
}

/// A [`Verdict`] as Envoy's response, for `descriptors` descriptors: each status describes the
/// limit [`Verdict::status`] chooses, as envoyproxy/ratelimit answers:
///
/// - a descriptor that matched an `unlimited` rule: `OK`, `limit_remaining` 4294967295 and no
///   `current_limit`;
/// - a limit that refused the request: `limit_remaining` 0, whatever was left for a cheaper
///   request (the native `/v1/check` keeps the true remainder);
/// - a descriptor refused only by a shadow (or soft) limit: `OK` with nothing remaining;
/// - a descriptor no rule matched (or with no entries): `OK`, nothing else.
pub fn to_response(verdict: &Verdict, descriptors: usize) -> RateLimitResponse {
    let statuses = (0..descriptors)
        .map(|i| {
            let status = verdict.status(i);
            if status.limit.is_none() && verdict.unlimited.contains(&i) {
                return DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                };
            }
            let code = if status.refused {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32;
            match status.limit {
                None => DescriptorStatus {
                    code,
                    ..Default::default()
                },
                Some(c) => DescriptorStatus {
                    code,
                    current_limit: Some(current_limit(c)),
                    limit_remaining: if c.decision.allowed {
                        u32::try_from(c.decision.remaining).unwrap_or(u32::MAX)
                    } else {
                        0
                    },
                    duration_until_reset: Some(whole_seconds(c.decision.reset_after)),
                    ..Default::default()
                },
            }
        })
        .collect();
    RateLimitResponse {
        overall_code: if verdict.allowed {
            Code::Ok
        } else {
            Code::OverLimit
        } as i32,
        statuses,
        ..Default::default()
    }
}

/// Envoy's description of the limit `c`: its name, and its requests per unit, which for a rate
/// is the rate (20 per second for a bucket of 40 refilling at 20 a second), not its burst.
fn current_limit(c: &LimitResult) -> RateLimit {
    let (requests, per) = c.policy().requests_per();
    RateLimit {
        name: c.rule.name.as_deref().unwrap_or_default().to_owned(),
        requests_per_unit: u32::try_from(requests).unwrap_or(u32::MAX),
        unit: envoy_unit(per) as i32,
    }
}

/// A reset in whole seconds, rounded up, as envoyproxy/ratelimit reports it (`60s` at the start
/// of a minute's window, `1s` in its last second), so clients that read only `seconds` see a
/// time that has not passed yet.
pub(crate) fn whole_seconds(d: Duration) -> envoy_types::pb::google::protobuf::Duration {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    proto_duration(Duration::from_secs(secs))
}

fn proto_duration(d: Duration) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}
