//! Envoy's `/json`: a `RateLimitRequest` in, a `RateLimitResponse` out, in protobuf's JSON
//! form, answered from the same response the gRPC service sends.

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sluice_http::problem::Problem;

use axum::http::StatusCode;

use super::{ApiState, decide};
use crate::envoy::{Code, EnvoyUnit, to_response};
use crate::metadata::{dynamic_metadata, struct_json};

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// A protobuf duration in its JSON form, such as `"1.500s"`.
fn json_duration(d: Duration) -> String {
    match d.subsec_millis() {
        0 => format!("{}s", d.as_secs()),
        ms => format!("{}.{ms:03}s", d.as_secs()),
    }
}

/// One descriptor's status in Envoy's JSON form, borrowed from the response.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonStatus<'a> {
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_limit: Option<JsonLimit<'a>>,
    #[serde(skip_serializing_if = "is_zero")]
    limit_remaining: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_until_reset: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonLimit<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    name: &'a str,
    requests_per_unit: u32,
    unit: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonResponse<'a> {
    overall_code: &'static str,
    statuses: Vec<JsonStatus<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    response_headers_to_add: Vec<JsonHeader<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dynamic_metadata: Option<serde_json::Value>,
}

#[derive(Serialize)]
struct JsonHeader<'a> {
    key: &'a str,
    value: &'a str,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Envoy's `/json`: a RateLimitRequest in, a RateLimitResponse out, in protobuf's JSON form.
pub(super) async fn envoy_json(
    State(state): State<ApiState>,
    body: Body,
) -> Result<Response, Problem> {
    let super::Decided {
        request,
        sent_cost,
        verdict,
    } = decide(&state, body).await?;
    let mut response = to_response(&verdict, request.descriptors.len());
    state.envoy.finish(&mut response);
    if state.envoy.dynamic_metadata {
        let sent = u32::try_from(sent_cost).unwrap_or(u32::MAX);
        response.dynamic_metadata = Some(dynamic_metadata(sent, &request, &verdict));
    }
    let statuses = response
        .statuses
        .iter()
        .map(|s| JsonStatus {
            code: code_name(s.code),
            current_limit: s.current_limit.as_ref().map(|l| JsonLimit {
                name: &l.name,
                requests_per_unit: l.requests_per_unit,
                unit: EnvoyUnit::try_from(l.unit).map_or("UNKNOWN", |u| u.as_str_name()),
            }),
            limit_remaining: s.limit_remaining,
            duration_until_reset: s.duration_until_reset.as_ref().map(|d| {
                json_duration(Duration::new(
                    d.seconds.max(0).unsigned_abs(),
                    d.nanos.max(0).unsigned_abs(),
                ))
            }),
        })
        .collect();
    let body = JsonResponse {
        overall_code: code_name(response.overall_code),
        statuses,
        response_headers_to_add: response
            .response_headers_to_add
            .iter()
            .map(|h| JsonHeader {
                key: &h.key,
                value: &h.value,
            })
            .collect(),
        dynamic_metadata: response.dynamic_metadata.as_ref().map(struct_json),
    };
    // The HTTP status follows the answer's code, so a shadow-mode answer is a 200.
    let status = if response.overall_code == Code::OverLimit as i32 {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(body)).into_response())
}
