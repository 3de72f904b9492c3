//! The HTTP API: Envoy's `/json`, Sluice's `/v1/check`, health, metrics and admin.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sluice_core::{Decision, Policy};
use sluice_http::{HeaderStyle, Quota, rate_limit_headers};
use sluice_rules::{DescriptorConfig, ReloadEvent, Unit};

use crate::envoy::{Code, EnvoyUnit, envoy_unit, to_response};
use crate::limiter::{LimitOverride, LimitRequest, Limiter, RequestDescriptor, Verdict};
use crate::limits::MAX_BODY;
use crate::problem::Problem;

/// What the HTTP handlers share.
#[derive(Debug, Clone)]
pub struct ApiState {
    /// The limiter.
    pub limiter: Arc<Limiter>,
    /// A bearer token that opens the admin endpoints to non-loopback peers.
    pub admin_token: Option<Arc<str>>,
    /// Which rate-limit headers `/v1/check` answers carry.
    pub headers: HeaderStyle,
    /// The Redis store behind the limiter, if any, for its breaker state.
    pub redis: Option<sluice_redis::RedisStore>,
}

/// The router. Serve it with `into_make_service_with_connect_info::<SocketAddr>()`, which the
/// admin endpoints need to tell loopback peers apart.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/json", post(envoy_json))
        .route("/v1/check", post(check))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/rules", get(rules))
        .route("/v1/reload", post(reload))
        .route("/v1/keys/{counter}", get(inspect_key).delete(reset_key))
        .fallback(|| async {
            Problem::new(
                StatusCode::NOT_FOUND,
                "no such endpoint; see docs/openapi.yaml",
            )
        })
        .with_state(state)
}

/// Reads a JSON body of at most [`MAX_BODY`] bytes into `T`, naming the field at fault.
async fn read_json<T: DeserializeOwned>(body: Body) -> Result<T, Problem> {
    let bytes: Bytes = axum::body::to_bytes(body, MAX_BODY).await.map_err(|_| {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {MAX_BODY} bytes"),
        )
    })?;
    // Plain parsing is the fast path; only a body that fails is parsed again, tracking the
    // path, to name the field at fault.
    if let Ok(value) = serde_json::from_slice(&bytes) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(&bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        Problem::bad_request(format!("invalid JSON: {}", e.inner())).with_field(field)
    })?;
    de.end()
        .map_err(|e| Problem::bad_request(format!("invalid JSON: {e}")))?;
    Ok(value)
}

/// An unsigned integer as protobuf's JSON mapping writes it: a number (`5`, or `5.0` with no
/// fraction) or a decimal string (`"5"`, how 64-bit integers are usually sent).
fn flex_u64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    use serde::de::Error;
    let v = Option::<Value>::deserialize(d)?;
    let n = match &v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= 2f64.powi(53))
                .map(|f| f as u64)
        }),
        Some(Value::String(s)) => s.parse::<u64>().ok(),
        Some(_) => None,
    };
    n.map(Some).ok_or_else(|| {
        D::Error::custom(format!(
            "expected a non-negative whole number, found {}",
            v.unwrap_or(Value::Null)
        ))
    })
}

#[derive(Debug, Deserialize)]
struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
struct JsonOverride {
    #[serde(alias = "requestsPerUnit", deserialize_with = "flex_u64", default)]
    requests_per_unit: Option<u64>,
    unit: Value,
}

#[derive(Debug, Deserialize)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, alias = "hitsAddend", deserialize_with = "flex_u64")]
    hits_addend: Option<u64>,
    /// Sluice's native name for the descriptor's own cost.
    #[serde(default, deserialize_with = "flex_u64")]
    cost: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hitsAddend", deserialize_with = "flex_u64")]
    hits_addend: Option<u64>,
    /// Sluice's native name for the request's cost.
    #[serde(default, deserialize_with = "flex_u64")]
    cost: Option<u64>,
}

fn parse_unit(v: &Value, field: String) -> Result<Unit, Problem> {
    let unit = match v {
        Value::String(s) => Unit::parse(s),
        Value::Number(n) => n
            .as_i64()
            .and_then(|n| EnvoyUnit::try_from(i32::try_from(n).ok()?).ok())
            .and_then(|u| Unit::parse(u.as_str_name())),
        _ => None,
    };
    unit.ok_or_else(|| {
        Problem::bad_request(format!(
            "unknown unit {v}; expected one of {}",
            Unit::NAMES.join(", ")
        ))
        .with_field(field)
    })
}

impl JsonRequest {
    fn into_limit_request(self) -> Result<LimitRequest, Problem> {
        let mut descriptors = Vec::with_capacity(self.descriptors.len());
        for (i, d) in self.descriptors.into_iter().enumerate() {
            let limit_override = match d.limit {
                Some(o) => Some(LimitOverride {
                    requests_per_unit: o.requests_per_unit.ok_or_else(|| {
                        Problem::bad_request("a limit override needs requests_per_unit")
                            .with_field(format!("descriptors[{i}].limit.requests_per_unit"))
                    })?,
                    unit: parse_unit(&o.unit, format!("descriptors[{i}].limit.unit"))?,
                }),
                None => None,
            };
            if d.cost.is_some() && d.hits_addend.is_some() {
                return Err(
                    Problem::bad_request("give `cost` or `hits_addend`, not both")
                        .with_field(format!("descriptors[{i}].cost")),
                );
            }
            descriptors.push(RequestDescriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                cost: d.cost.or(d.hits_addend),
                limit_override,
            });
        }
        if self.cost.is_some() && self.hits_addend.is_some() {
            return Err(
                Problem::bad_request("give `cost` or `hits_addend`, not both").with_field("cost"),
            );
        }
        Ok(LimitRequest {
            domain: self.domain,
            descriptors,
            cost: self.cost.or(self.hits_addend).unwrap_or(1).max(1),
        })
    }
}

async fn decide(state: &ApiState, body: Body) -> Result<(LimitRequest, Verdict), Problem> {
    let request = read_json::<JsonRequest>(body).await?.into_limit_request()?;
    let verdict = state
        .limiter
        .decide(&request)
        .await
        .map_err(|e| Problem::bad_request(e.to_string()))?;
    Ok((request, verdict))
}

fn status_of(verdict: &Verdict) -> StatusCode {
    if verdict.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    }
}

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
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Envoy's `/json`: a RateLimitRequest in, a RateLimitResponse out, in protobuf's JSON form.
async fn envoy_json(State(state): State<ApiState>, body: Body) -> Result<Response, Problem> {
    let (request, verdict) = decide(&state, body).await?;
    let response = to_response(&verdict, request.descriptors.len());
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
    };
    Ok((status_of(&verdict), axum::Json(body)).into_response())
}

fn secs(d: Duration) -> Value {
    if d == Decision::NEVER {
        Value::Null
    } else {
        json!(d.as_secs_f64())
    }
}

/// Sluice's `/v1/check`: one decision per limit, per descriptor, and the headers a gateway
/// would set.
async fn check(State(state): State<ApiState>, body: Body) -> Result<Response, Problem> {
    let (request, verdict) = decide(&state, body).await?;
    let descriptors: Vec<Value> = (0..request.descriptors.len())
        .map(|i| {
            let limits: Vec<Value> = verdict
                .for_descriptor(i)
                .map(|c| {
                    json!({
                        "name": &*c.name,
                        "key": c.key,
                        "algorithm": c.policy.algorithm().name(),
                        "outcome": c.outcome.name(),
                        "allowed": c.decision.allowed,
                        "limit": c.decision.limit,
                        "remaining": c.decision.remaining,
                        "window": c.policy.window().as_secs_f64(),
                        "reset_after": secs(c.decision.reset_after),
                        "retry_after": secs(c.decision.retry_after),
                        "delay": secs(c.decision.delay),
                        "action": c.rule.as_ref().map_or("reject", |r| r.action.name()),
                    })
                })
                .collect();
            let allowed = verdict
                .for_descriptor(i)
                .all(|c| c.decision.allowed || !c.enforced());
            json!({
                "allowed": allowed,
                "unlimited": verdict.unlimited.contains(&i),
                "limits": limits,
            })
        })
        .collect();
    let quotas: Vec<Quota<'_>> = verdict
        .checks
        .iter()
        .filter(|c| c.enforced())
        .map(|c| Quota::new(&c.name, &c.policy, &c.decision))
        .collect();
    let headers = rate_limit_headers(&quotas, state.headers);
    let header_json: serde_json::Map<String, Value> = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), json!(v.to_str().unwrap_or_default())))
        .collect();
    let body =
        json!({ "allowed": verdict.allowed, "descriptors": descriptors, "headers": header_json });
    let mut response = (status_of(&verdict), axum::Json(body)).into_response();
    response.headers_mut().extend(headers);
    Ok(response)
}

async fn readyz(State(state): State<ApiState>) -> Response {
    if let Some(breaker) = state.redis.as_ref().map(|r| r.breaker_state()) {
        if breaker == sluice_redis::BreakerState::Open {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "store: circuit breaker open; rules fall back to on_store_error",
            )
                .into_response();
        }
    }
    let probe = match sluice_core::FixedWindow::new(
        1,
        Duration::from_secs(1),
        sluice_core::Alignment::FirstRequest,
    ) {
        Ok(p) => Policy::from(p),
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let store = state.limiter.store().clone();
    let answer = tokio::time::timeout(Duration::from_secs(1), async move {
        store.peek("sluice:readyz", &probe).await.map(|_| ())
    })
    .await;
    match answer {
        Ok(Ok(())) => (StatusCode::OK, "ready").into_response(),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}")).into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "store: no answer within 1s",
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<ApiState>) -> Response {
    let limiter = &state.limiter;
    let stats = limiter.reloader().stats();
    let mut text = limiter.metrics().render(
        limiter.store().tracked_keys(),
        stats.reloads.load(std::sync::atomic::Ordering::Relaxed),
        stats.failures.load(std::sync::atomic::Ordering::Relaxed),
    );
    if let Some(redis) = &state.redis {
        insert_before_eof(&mut text, &redis_metrics(redis));
    }
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

/// The Redis store's breaker state and refund counters, in the exposition format.
fn redis_metrics(redis: &sluice_redis::RedisStore) -> String {
    use sluice_redis::BreakerState;
    let current = redis.breaker_state();
    let stats = redis.stats();
    let mut out = String::from(
        "# HELP sluice_store_breaker_state The Redis circuit breaker's state (1 for the current one).\n\
         # TYPE sluice_store_breaker_state gauge\n",
    );
    for s in [
        BreakerState::Closed,
        BreakerState::Open,
        BreakerState::HalfOpen,
    ] {
        out.push_str(&format!(
            "sluice_store_breaker_state{{state=\"{}\"}} {}\n",
            s.name(),
            u8::from(s == current)
        ));
    }
    out.push_str(&format!(
        "# HELP sluice_store_refunds Requests whose checks spanned Cluster slots and were refunded.\n\
         # TYPE sluice_store_refunds counter\n\
         sluice_store_refunds_total {}\n\
         # HELP sluice_store_refund_failures Refunds that failed, leaving a reservation to expire.\n\
         # TYPE sluice_store_refund_failures counter\n\
         sluice_store_refund_failures_total {}\n\
         # HELP sluice_store_short_circuited Store calls failed at once because the breaker was open.\n\
         # TYPE sluice_store_short_circuited counter\n\
         sluice_store_short_circuited_total {}\n",
        stats.refunds, stats.refund_failures, stats.short_circuited
    ));
    out
}

/// Inserts `extra` before the exposition's closing `# EOF` line.
fn insert_before_eof(text: &mut String, extra: &str) {
    match text.rfind("# EOF") {
        Some(at) => text.insert_str(at, extra),
        None => text.push_str(extra),
    }
}

/// Admin endpoints answer loopback peers, and others only with the admin token.
fn authorize(state: &ApiState, peer: SocketAddr, headers: &HeaderMap) -> Result<(), Problem> {
    admit_admin(state.admin_token.as_deref(), peer, headers)
}

fn admit_admin(token: Option<&str>, peer: SocketAddr, headers: &HeaderMap) -> Result<(), Problem> {
    if peer.ip().is_loopback() {
        return Ok(());
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match (token, presented) {
        (Some(token), Some(p)) if constant_time_eq(token.as_bytes(), p.as_bytes()) => Ok(()),
        (None, _) => Err(Problem::new(
            StatusCode::FORBIDDEN,
            "admin endpoints answer loopback only; start the server with --admin-token to allow others",
        )),
        _ => Err(Problem::new(
            StatusCode::UNAUTHORIZED,
            "a valid `Authorization: Bearer` admin token is required",
        )),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn describe_descriptor(d: &DescriptorConfig) -> Value {
    let limits: Vec<Value> = d
        .limits
        .iter()
        .map(|l| {
            json!({
                "name": l.name.as_deref(),
                "algorithm": l.policy.algorithm().name(),
                "limit": l.policy.limit(),
                "window": l.policy.window().as_secs_f64(),
                "unit": match envoy_unit(l.policy.window()) { EnvoyUnit::Unknown => None, u => Some(u.as_str_name()) },
                "action": l.action.name(),
                "shadow": l.shadow,
                "replaces": l.replaces.iter().map(|r| &**r).collect::<Vec<_>>(),
                "location": l.location.to_string(),
            })
        })
        .collect();
    json!({
        "key": d.key,
        "value": d.value.to_string(),
        "unlimited": d.unlimited,
        "limits": limits,
        "descriptors": d.descriptors.iter().map(describe_descriptor).collect::<Vec<_>>(),
    })
}

async fn rules(
    State(state): State<ApiState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    authorize(&state, peer, &headers)?;
    let rules = state.limiter.reloader().rules();
    let domains: Vec<Value> = rules
        .domain_names()
        .into_iter()
        .filter_map(|name| rules.domain(name))
        .map(|d| json!({ "domain": d.name, "descriptors": d.descriptors.iter().map(describe_descriptor).collect::<Vec<_>>() }))
        .collect();
    Ok(axum::Json(
        json!({ "fingerprint": format!("{:016x}", rules.fingerprint()), "domains": domains }),
    )
    .into_response())
}

async fn reload(
    State(state): State<ApiState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    authorize(&state, peer, &headers)?;
    let reloader = state.limiter.reloader().clone();
    let event = tokio::task::spawn_blocking(move || reloader.reload_now())
        .await
        .map_err(|e| {
            Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("reload task failed: {e}"),
            )
        })?;
    Ok(match event {
        ReloadEvent::Reloaded { fingerprint } => axum::Json(
            json!({ "result": "reloaded", "fingerprint": format!("{fingerprint:016x}") }),
        )
        .into_response(),
        ReloadEvent::Unchanged => axum::Json(json!({ "result": "unchanged" })).into_response(),
        ReloadEvent::Failed(e) => Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("the rules were not reloaded; the old rules stay in force: {e}"),
        )
        .into_response(),
    })
}

/// The policy a counter key was written under, from the rules in force.
fn policy_for_key(state: &ApiState, counter: &str) -> Result<Arc<Policy>, Problem> {
    state
        .limiter
        .reloader()
        .rules()
        .policy_for_key(counter)
        .ok_or_else(|| {
            Problem::new(
                StatusCode::NOT_FOUND,
                "no rule in force writes this counter; check the key, as shown by /v1/check",
            )
        })
}

async fn inspect_key(
    State(state): State<ApiState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path(counter): Path<String>,
) -> Result<Response, Problem> {
    authorize(&state, peer, &headers)?;
    let policy = policy_for_key(&state, &counter)?;
    let d = state
        .limiter
        .store()
        .peek(&counter, &policy)
        .await
        .map_err(|e| Problem::new(StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}")))?;
    Ok(axum::Json(json!({
        "key": counter,
        "algorithm": policy.algorithm().name(),
        "limit": d.limit,
        "remaining": d.remaining,
        "limited": !d.allowed,
        "reset_after": secs(d.reset_after),
        "retry_after": secs(d.retry_after),
    }))
    .into_response())
}

async fn reset_key(
    State(state): State<ApiState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path(counter): Path<String>,
) -> Result<Response, Problem> {
    authorize(&state, peer, &headers)?;
    let existed = state
        .limiter
        .store()
        .reset(&counter)
        .await
        .map_err(|e| Problem::new(StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}")))?;
    tracing::info!(counter, existed, "counter reset by admin");
    Ok(axum::Json(json!({ "key": counter, "reset": existed })).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        h
    }

    #[test]
    fn admin_answers_loopback_or_the_token_only() {
        let loopback: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let v6_loopback: SocketAddr = "[::1]:5000".parse().unwrap();
        let remote: SocketAddr = "10.1.2.3:5000".parse().unwrap();
        let none = HeaderMap::new();
        assert!(admit_admin(None, loopback, &none).is_ok());
        assert!(admit_admin(None, v6_loopback, &none).is_ok());
        assert!(
            admit_admin(None, remote, &bearer("s3cret")).is_err(),
            "no token configured"
        );
        assert!(admit_admin(Some("s3cret"), remote, &none).is_err());
        assert!(admit_admin(Some("s3cret"), remote, &bearer("wrong")).is_err());
        assert!(admit_admin(Some("s3cret"), remote, &bearer("s3cre")).is_err());
        assert!(admit_admin(Some("s3cret"), remote, &bearer("s3cret")).is_ok());
    }
}
