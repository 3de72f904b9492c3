//! Envoy's `/json`: a `RateLimitRequest` in, a `RateLimitResponse` out, in protobuf's JSON
//! form, answered from the same response the gRPC service sends.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;
use sluice_http::problem::Problem;

use super::check::json_answer;
use super::{ApiBody, ApiState, decide};
use crate::envoy::{Code, EnvoyUnit, RateLimitResponse, to_response};
use crate::metadata::{dynamic_metadata, struct_json};

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// Envoy's `/json`: a RateLimitRequest in, a RateLimitResponse out, in protobuf's JSON form.
pub(super) async fn answer(state: &ApiState, body: impl ApiBody) -> Result<Response, Problem> {
    let super::Decided {
        request,
        sent_cost,
        verdict,
    } = decide(state, body).await?;
    let mut response = to_response(&verdict, request.descriptors.len());
    let shadowed = state.envoy.finish(&mut response);
    if let Some(stats) = &state.envoy_stats {
        stats.count_verdict(&request, &verdict);
        if shadowed {
            stats.count_global_shadow();
        }
    }
    if state.envoy.dynamic_metadata {
        let sent = u32::try_from(sent_cost).unwrap_or(u32::MAX);
        response.dynamic_metadata = Some(dynamic_metadata(sent, &request, &verdict));
    }
    // The HTTP status follows the answer's code, so a shadow-mode answer is a 200.
    let status = if response.overall_code == Code::OverLimit as i32 {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    Ok(json_answer(status, json_response(&response), Vec::new()))
}

/// `response` in protobuf's JSON form, written out directly: the enum names and numbers need
/// no escaping, and only the strings that may (names, headers, metadata) go through
/// serde_json. A derived `Serialize` escapes every field name and value, which cost more than
/// the rest of the answer.
fn json_response(response: &RateLimitResponse) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 128 * response.statuses.len());
    out.extend_from_slice(b"{\"overallCode\":\"");
    out.extend_from_slice(code_name(response.overall_code).as_bytes());
    out.extend_from_slice(b"\",\"statuses\":[");
    for (i, s) in response.statuses.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"code\":\"");
        out.extend_from_slice(code_name(s.code).as_bytes());
        out.push(b'"');
        if let Some(l) = &s.current_limit {
            out.extend_from_slice(b",\"currentLimit\":{");
            if !l.name.is_empty() {
                out.extend_from_slice(b"\"name\":");
                json_string(&mut out, &l.name);
                out.push(b',');
            }
            out.extend_from_slice(b"\"requestsPerUnit\":");
            number(&mut out, l.requests_per_unit);
            out.extend_from_slice(b",\"unit\":\"");
            let unit = EnvoyUnit::try_from(l.unit).map_or("UNKNOWN", |u| u.as_str_name());
            out.extend_from_slice(unit.as_bytes());
            out.extend_from_slice(b"\"}");
        }
        if s.limit_remaining != 0 {
            out.extend_from_slice(b",\"limitRemaining\":");
            number(&mut out, s.limit_remaining);
        }
        if let Some(d) = &s.duration_until_reset {
            out.extend_from_slice(b",\"durationUntilReset\":\"");
            json_duration(
                &mut out,
                Duration::new(
                    d.seconds.max(0).unsigned_abs(),
                    d.nanos.max(0).unsigned_abs(),
                ),
            );
            out.push(b'"');
        }
        out.push(b'}');
    }
    out.push(b']');
    if !response.response_headers_to_add.is_empty() {
        out.extend_from_slice(b",\"responseHeadersToAdd\":[");
        for (i, h) in response.response_headers_to_add.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"key\":");
            json_string(&mut out, &h.key);
            out.extend_from_slice(b",\"value\":");
            json_string(&mut out, &h.value);
            out.push(b'}');
        }
        out.push(b']');
    }
    if let Some(metadata) = &response.dynamic_metadata {
        out.extend_from_slice(b",\"dynamicMetadata\":");
        // Writing a `serde_json::Value` into a `Vec` cannot fail.
        let _ = serde_json::to_writer(&mut out, &struct_json(metadata));
    }
    out.push(b'}');
    out
}

/// `s` as a JSON string, escaped.
fn json_string(out: &mut Vec<u8>, s: &str) {
    // Writing a string into a `Vec` cannot fail.
    let _ = serde_json::to_writer(out, s);
}

fn number(out: &mut Vec<u8>, n: u32) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// A protobuf duration in its JSON form, such as `1.500s`, without the quotes.
fn json_duration(out: &mut Vec<u8>, d: Duration) {
    out.extend_from_slice(itoa::Buffer::new().format(d.as_secs()).as_bytes());
    let ms = d.subsec_millis();
    if ms != 0 {
        out.push(b'.');
        let digits = [ms / 100, ms / 10 % 10, ms % 10].map(|d| b'0' + d as u8);
        out.extend_from_slice(&digits);
    }
    out.push(b's');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::{DescriptorStatus, RateLimit};
    use envoy_types::pb::envoy::config::core::v3::HeaderValue as EnvoyHeader;
    use serde_json::{Value, json};

    #[test]
    fn the_answer_is_protobufs_json_form_with_strings_escaped() {
        let response = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![
                DescriptorStatus {
                    code: Code::OverLimit as i32,
                    current_limit: Some(RateLimit {
                        name: "per \"user\"\n".into(),
                        requests_per_unit: 10,
                        unit: EnvoyUnit::Minute as i32,
                    }),
                    limit_remaining: 0,
                    duration_until_reset: Some(envoy_types::pb::google::protobuf::Duration {
                        seconds: 1,
                        nanos: 5_000_000,
                    }),
                    ..Default::default()
                },
                DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
            ],
            response_headers_to_add: vec![EnvoyHeader {
                key: "x-ratelimit-limit".into(),
                value: "10, 10;w=60".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let written: Value = serde_json::from_slice(&json_response(&response)).unwrap();
        assert_eq!(
            written,
            json!({
                "overallCode": "OVER_LIMIT",
                "statuses": [
                    {
                        "code": "OVER_LIMIT",
                        "currentLimit": {"name": "per \"user\"\n", "requestsPerUnit": 10, "unit": "MINUTE"},
                        "durationUntilReset": "1.005s"
                    },
                    {"code": "OK", "limitRemaining": 4294967295u32}
                ],
                "responseHeadersToAdd": [{"key": "x-ratelimit-limit", "value": "10, 10;w=60"}]
            })
        );
        let plain = RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        };
        assert_eq!(
            String::from_utf8(json_response(&plain)).unwrap(),
            r#"{"overallCode":"OK","statuses":[]}"#
        );
    }

    #[test]
    fn durations_are_written_in_seconds_with_milliseconds_when_there_are_any() {
        for (d, text) in [
            (Duration::from_secs(60), "60s"),
            (Duration::ZERO, "0s"),
            (Duration::from_millis(1_500), "1.500s"),
            (Duration::from_millis(42), "0.042s"),
        ] {
            let mut out = Vec::new();
            json_duration(&mut out, d);
            assert_eq!(String::from_utf8(out).unwrap(), text);
        }
    }
}
