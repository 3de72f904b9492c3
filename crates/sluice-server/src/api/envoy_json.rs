//! Envoy's `/json`: a `RateLimitRequest` in, a `RateLimitResponse` out, in protobuf's JSON
//! form, answered from the same response the gRPC service sends.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;
use sluice_http::problem::Problem;
use sluice_limiter::Verdict;

use super::check::json_answer;
use super::{ApiBody, ApiState, decide, json_out};
use crate::envoy::{Code, EnvoyUnit, RateLimitResponse, envoy_unit, to_response, whole_seconds};
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
    if state.envoy.limit_headers.is_none() && !state.envoy.dynamic_metadata {
        // The answer as clients mostly ask for it, written from the verdict.
        let shadowed = state.envoy.shadow_mode && !verdict.allowed;
        if let Some(stats) = &state.envoy_stats {
            stats.count_verdict(&request, &verdict);
            if shadowed {
                stats.count_global_shadow();
            }
        }
        let status = if verdict.allowed || shadowed {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        let body = json_verdict(&verdict, request.descriptors.len(), shadowed);
        return Ok(json_answer(status, body, Vec::new()));
    }
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

/// What [`json_response`] writes for `to_response(verdict, descriptors)` finished without
/// rate-limit headers or dynamic metadata (`shadowed`: the shadow mode turned it to `OK`),
/// byte for byte, written from the verdict itself: building the `RateLimitResponse` first,
/// with a copy of each limit's name, and reading it back cost a `/json` answer about 800
/// instructions.
fn json_verdict(verdict: &Verdict, descriptors: usize, shadowed: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 128 * descriptors);
    out.extend_from_slice(if verdict.allowed || shadowed {
        b"{\"overallCode\":\"OK\",\"statuses\":["
    } else {
        b"{\"overallCode\":\"OVER_LIMIT\",\"statuses\":["
    });
    for i in 0..descriptors {
        if i > 0 {
            out.push(b',');
        }
        let status = verdict.status(i);
        // Each arm as `to_response` maps the descriptor's status.
        let Some(c) = status.limit else {
            out.extend_from_slice(if verdict.unlimited.contains(&i) {
                b"{\"code\":\"OK\",\"limitRemaining\":4294967295}"
            } else if status.refused {
                b"{\"code\":\"OVER_LIMIT\"}"
            } else {
                b"{\"code\":\"OK\"}"
            });
            continue;
        };
        out.extend_from_slice(if status.refused {
            b"{\"code\":\"OVER_LIMIT\",\"currentLimit\":{"
        } else {
            b"{\"code\":\"OK\",\"currentLimit\":{"
        });
        let name = c.rule.name.as_deref().unwrap_or_default();
        if !name.is_empty() {
            out.extend_from_slice(b"\"name\":");
            json_out::string(&mut out, name);
            out.push(b',');
        }
        let (requests, per) = c.policy().requests_per();
        out.extend_from_slice(b"\"requestsPerUnit\":");
        number(&mut out, u32::try_from(requests).unwrap_or(u32::MAX));
        out.extend_from_slice(b",\"unit\":\"");
        out.extend_from_slice(envoy_unit(per).as_str_name().as_bytes());
        out.extend_from_slice(b"\"}");
        let remaining = if c.decision.allowed {
            u32::try_from(c.decision.remaining).unwrap_or(u32::MAX)
        } else {
            0
        };
        if remaining != 0 {
            out.extend_from_slice(b",\"limitRemaining\":");
            number(&mut out, remaining);
        }
        // Whole seconds, so no fraction: as `json_duration` writes them.
        out.extend_from_slice(b",\"durationUntilReset\":\"");
        let reset = whole_seconds(c.decision.reset_after).seconds.max(0);
        out.extend_from_slice(itoa::Buffer::new().format(reset).as_bytes());
        out.extend_from_slice(b"s\"}");
    }
    out.extend_from_slice(b"]}");
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

    /// Over many verdicts (allowed, refused, shadow limits and the global shadow mode, several
    /// limits on one descriptor, unlimited and unmatched descriptors, names to escape, limits
    /// past 32 bits), the answer written from the verdict is byte for byte the one written from
    /// its `RateLimitResponse`.
    #[tokio::test]
    async fn the_answer_from_the_verdict_is_the_one_from_its_response() {
        use std::sync::Arc;

        use sluice_core::MemoryStore;
        use sluice_limiter::{LimitRequest, Limiter, Metrics, RequestDescriptor};
        use sluice_rules::Reloader;

        use crate::compat::EnvoyAnswers;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        std::fs::write(
            &path,
            r#"
domain: d
descriptors:
  - key: user
    rate_limit: {name: "per \"user\"\n", unit: minute, requests_per_unit: 3}
  - key: plan
    value: free
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra}
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_counter}
  - key: watch
    shadow_mode: true
    rate_limit: {name: watched, unit: day, requests_per_unit: 2, algorithm: fixed_window}
  - key: big
    rate_limit: {unit: week, requests_per_unit: 5000000000}
  - key: vip
    rate_limit: {unlimited: true}
"#,
        )
        .unwrap();
        let limiter = Limiter::new(
            Reloader::new(vec![path]).unwrap(),
            Arc::new(MemoryStore::new()),
            Arc::new(Metrics::new()),
        );
        let descriptor = |entries: &[(&str, &str)], cost: Option<u64>| RequestDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            cost,
            ..Default::default()
        };
        let mut seen = (false, false);
        for round in 0..24u64 {
            let all = [
                descriptor(&[("user", "a\u{1}\"b")], None),
                descriptor(&[("plan", "free"), ("user", "x")], None),
                descriptor(&[("watch", "w")], None),
                descriptor(&[("big", "b")], Some(round * 1_000_000)),
                descriptor(&[("vip", "v")], None),
                descriptor(&[("nothing", "n")], None),
                descriptor(&[], None),
            ];
            // A different subset and order of the descriptors each round.
            let descriptors: Vec<_> = (0..all.len())
                .map(|i| (i + round as usize) % all.len())
                .filter(|i| (round >> (i % 3)) & 1 == 0 || *i == 0)
                .map(|i| all[i].clone())
                .collect();
            let request = LimitRequest {
                domain: "d".into(),
                descriptors,
                cost: 1 + round % 2,
            };
            let n = request.descriptors.len();
            let verdict = limiter.decide(&request).await.unwrap();
            seen = (seen.0 | verdict.allowed, seen.1 | !verdict.allowed);
            for shadow_mode in [false, true] {
                let answers = EnvoyAnswers {
                    shadow_mode,
                    ..Default::default()
                };
                let mut response = to_response(&verdict, n);
                let shadowed = answers.finish(&mut response);
                assert_eq!(
                    String::from_utf8(json_verdict(&verdict, n, shadowed)).unwrap(),
                    String::from_utf8(json_response(&response)).unwrap(),
                    "round {round}, shadow mode {shadow_mode}"
                );
            }
        }
        assert_eq!(seen, (true, true), "both allowed and refused verdicts");
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
