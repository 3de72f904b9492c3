//! Sluice's `/v1/check`: one decision per limit, per descriptor, the limit each descriptor's
//! status describes, and the headers a gateway would set. Unlike Envoy's `/json`, it keeps the
//! true remainder of every limit, shadow ones included.

use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use sluice_http::admin::secs;
use sluice_http::problem::Problem;

use sluice_limiter::{LimitRequest, Verdict};

use super::{ApiBody, ApiState, decide, status_of};

/// `POST /v1/check`.
pub(super) async fn answer(state: &ApiState, body: impl ApiBody) -> Result<Response, Problem> {
    let super::Decided {
        request, verdict, ..
    } = decide(state, body).await?;
    let (body, headers) = verdict_json(state, &request, &verdict);
    let mut response = (status_of(&verdict), axum::Json(Value::Object(body))).into_response();
    response.headers_mut().extend(headers);
    Ok(response)
}

/// A verdict as `/v1/check` answers it: the body's fields, and the rate-limit headers, which
/// the body repeats under `headers`. `/v1/reserve` adds its own fields to the same body.
pub(super) fn verdict_json(
    state: &ApiState,
    request: &LimitRequest,
    verdict: &Verdict,
) -> (Map<String, Value>, Vec<(HeaderName, HeaderValue)>) {
    let descriptors: Vec<Value> = (0..request.descriptors.len())
        .map(|i| {
            let limits: Vec<Value> = verdict
                .for_descriptor(i)
                .map(|c| {
                    json!({
                        "name": c.name(),
                        "key": c.key,
                        "algorithm": c.policy().algorithm().name(),
                        "outcome": c.outcome.name(),
                        "allowed": c.decision.allowed,
                        "limit": c.decision.limit,
                        "remaining": c.decision.remaining,
                        "window": c.policy().window().as_secs_f64(),
                        "description": c.policy().to_string(),
                        "reset_after": secs(c.decision.reset_after),
                        "retry_after": secs(c.decision.retry_after),
                        "delay": secs(c.decision.delay),
                        "action": c.rule.action.name(),
                    })
                })
                .collect();
            let status = verdict.status(i);
            json!({
                "allowed": !status.refused,
                "unlimited": verdict.unlimited.contains(&i),
                "tightest": status.limit.map(|c| c.name()),
                "limits": limits,
            })
        })
        .collect();
    let headers = verdict.headers(state.headers);
    let header_json: Map<String, Value> = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), json!(v.to_str().unwrap_or_default())))
        .collect();
    let mut body = Map::new();
    body.insert("allowed".into(), json!(verdict.allowed));
    body.insert("descriptors".into(), Value::Array(descriptors));
    body.insert("headers".into(), Value::Object(header_json));
    (body, headers)
}
