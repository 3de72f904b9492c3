//! The admin and operations endpoints every Sluice listener serves: `/metrics`, `/healthz`,
//! `/readyz`, the dashboard page `/dashboard`, and the admin endpoints `GET /v1/rules`,
//! `POST /v1/reload`, `GET`/`DELETE /v1/keys/{counter}` and `GET /v1/dashboard`, which answer
//! loopback peers, or others with the admin token; so do `PUT`/`GET`/`DELETE
//! /v1/overrides/{domain}` (`admin_overrides.rs`). `sluice serve` merges them into its HTTP API; `sluice proxy` serves them on its admin
//! listener; an application can mount them too.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use sluice_core::{Decision, Policy};
use sluice_limiter::Limiter;
use sluice_rules::{DescriptorConfig, ReloadEvent, Unit};

use crate::PeerAddr;
use crate::problem::Problem;

/// What the admin handlers share.
#[derive(Debug, Clone)]
pub struct AdminState {
    /// The limiter whose rules, store and metrics the endpoints expose.
    pub limiter: Arc<Limiter>,
    /// A bearer token that opens the admin endpoints to non-loopback peers.
    pub admin_token: Option<Arc<str>>,
}

/// The admin router. Serve it with `into_make_service_with_connect_info::<SocketAddr>()`, which
/// the admin endpoints need to tell loopback peers apart.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/rules", get(rules))
        .route("/v1/reload", post(reload))
        .route("/v1/keys/{counter}", get(inspect_key).delete(reset_key))
        .route(
            "/v1/overrides/{domain}",
            get(crate::admin_overrides::list)
                .put(crate::admin_overrides::put)
                .delete(crate::admin_overrides::remove),
        )
        .route("/v1/dashboard", get(crate::dashboard::data))
        .route("/dashboard", get(crate::dashboard::page))
        .with_state(state)
}

/// A duration in seconds for JSON, `null` for never.
pub fn secs(d: Duration) -> Value {
    if d == Decision::NEVER {
        Value::Null
    } else {
        json!(d.as_secs_f64())
    }
}

/// `GET /readyz`: ready when the store answers. The body says `ready`, followed, when any
/// runtime override is set, by a line on where the overrides live and whether this instance's
/// copy is current (`docs/overrides.md`).
async fn readyz(State(state): State<AdminState>) -> Response {
    let (status, mut body) = ready(&state).await;
    let overrides = state.limiter.overrides();
    if overrides.any() || overrides.sync_status().error.is_some() {
        body.push('\n');
        body.push_str(&overrides.readiness());
    }
    (status, body).into_response()
}

/// Whether the store answers, and in words.
async fn ready(state: &AdminState) -> (StatusCode, String) {
    if let Some(breaker) = state.limiter.breaker() {
        if breaker == sluice_limiter::BreakerState::Open {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "store: circuit breaker open; rules fall back to on_store_error".into(),
            );
        }
    }
    let probe = Policy::probe();
    let store = state.limiter.store().clone();
    let answer = tokio::time::timeout(Duration::from_secs(1), async move {
        store.peek("sluice:readyz", &probe).await.map(|_| ())
    })
    .await;
    match answer {
        Ok(Ok(())) => (StatusCode::OK, "ready".into()),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}")),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "store: no answer within 1s".into(),
        ),
    }
}

/// `GET /metrics`: the limiter's metrics in the OpenMetrics text format, one page shared by the
/// scrapes of a second; `503` with `Retry-After` while clients that never read their answers
/// hold every page the limiter keeps ([`sluice_limiter::metrics_page`]).
pub async fn metrics(State(state): State<AdminState>) -> Response {
    let mut response = state.limiter.metrics_page().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

/// Admin endpoints answer loopback peers, and others only with the admin token.
pub(crate) fn authorize(
    state: &AdminState,
    peer: SocketAddr,
    headers: &HeaderMap,
) -> Result<(), Problem> {
    admit_admin(state.admin_token.as_deref(), peer, headers)
}

fn admit_admin(token: Option<&str>, peer: SocketAddr, headers: &HeaderMap) -> Result<(), Problem> {
    if peer.ip().is_loopback() {
        return Ok(());
    }
    // The scheme is case-insensitive (RFC 9110 §11.1): `bearer`, `BEARER` and `Bearer` alike.
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim_start());
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

fn describe_descriptor(limiter: &Limiter, domain: &str, d: &DescriptorConfig) -> Value {
    let limits: Vec<Value> = d
        .limits
        .iter()
        .map(|l| {
            let location = l.location.to_string();
            let overrides = limiter.overrides().applied_to(domain, &location);
            json!({
                "name": l.name.as_deref(),
                "algorithm": l.policy.algorithm().name(),
                "limit": l.policy.limit(),
                "window": l.policy.window().as_secs_f64(),
                "description": l.policy.to_string(),
                "unit": Unit::ALL.into_iter().find(|u| u.duration() == l.policy.window()).map(|u| u.name().to_ascii_uppercase()),
                "action": l.action.name(),
                "shadow": l.shadow,
                "replaces": l.replaces.iter().map(|r| &**r).collect::<Vec<_>>(),
                "location": location,
                "overrides": overrides,
            })
        })
        .collect();
    json!({
        "key": d.key,
        "value": d.value.to_string(),
        "unlimited": d.unlimited,
        "limits": limits,
        "descriptors": d.descriptors.iter().map(|c| describe_descriptor(limiter, domain, c)).collect::<Vec<_>>(),
    })
}

async fn rules(
    State(state): State<AdminState>,
    PeerAddr(peer): PeerAddr,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    authorize(&state, peer, &headers)?;
    Ok(axum::Json(rules_json(&state.limiter)).into_response())
}

/// The rules in force, as `GET /v1/rules` shows them.
pub(crate) fn rules_json(limiter: &Limiter) -> Value {
    let rules = limiter.reloader().rules();
    let domains: Vec<Value> = rules
        .domain_names()
        .into_iter()
        .filter_map(|name| rules.domain(name))
        .map(|d| json!({ "domain": d.name, "descriptors": d.descriptors.iter().map(|c| describe_descriptor(limiter, &d.name, c)).collect::<Vec<_>>() }))
        .collect();
    json!({ "fingerprint": format!("{:016x}", rules.fingerprint()), "domains": domains })
}

async fn reload(
    State(state): State<AdminState>,
    PeerAddr(peer): PeerAddr,
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
fn policy_for_key(state: &AdminState, counter: &str) -> Result<Arc<Policy>, Problem> {
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
    State(state): State<AdminState>,
    PeerAddr(peer): PeerAddr,
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
    State(state): State<AdminState>,
    PeerAddr(peer): PeerAddr,
    headers: HeaderMap,
    Path(counter): Path<String>,
) -> Result<Response, Problem> {
    authorize(&state, peer, &headers)?;
    let existed = state
        .limiter
        .reset_counter(&counter)
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
        for scheme in ["bearer", "BEARER", "BeArEr"] {
            let mut h = HeaderMap::new();
            h.insert(
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("{scheme} s3cret")).unwrap(),
            );
            assert!(admit_admin(Some("s3cret"), remote, &h).is_ok(), "{scheme}");
        }
        let mut basic = HeaderMap::new();
        basic.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic s3cret"),
        );
        assert!(admit_admin(Some("s3cret"), remote, &basic).is_err());
    }

    /// A scrape that comes while another's answer is still unread gets the same page, even
    /// when decisions came between them; clients that never read their answers hold at most
    /// `MAX_PAGES` pages, and a scrape that would need one more gets the newest of them until
    /// one is given back. (Rendered for each scrape, 100 such clients held 100 pages.)
    #[tokio::test(start_paused = true)]
    async fn scrapes_share_a_page_and_stalled_ones_hold_a_bounded_number() {
        use sluice_limiter::metrics_page::{MAX_PAGES, PAGE_FRESH_FOR};
        use sluice_limiter::{LimitRequest, RequestDescriptor};

        let (limiter, _clock, _dir) = sluice_testing::limiter(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n",
        );
        let state = AdminState {
            limiter: Arc::clone(&limiter),
            admin_token: None,
        };
        let request = LimitRequest {
            domain: "d".into(),
            descriptors: vec![RequestDescriptor::new([("k", "v")])],
            cost: 1,
        };
        let page = |answer: Response| async move {
            assert_eq!(answer.status(), StatusCode::OK);
            // A copy: the page itself would stay held.
            let page = axum::body::to_bytes(answer.into_body(), usize::MAX).await;
            String::from_utf8(page.unwrap().to_vec()).unwrap()
        };
        let unread = metrics(State(state.clone())).await;
        limiter.decide(&request).await.unwrap();
        let shared = page(metrics(State(state.clone())).await).await;
        let first = page(unread).await;
        assert_eq!(first, shared, "one page while an answer still holds it");
        let after = page(metrics(State(state.clone())).await).await;
        assert_ne!(
            after, first,
            "scrapes one after another see the counters move"
        );

        let mut unread = Vec::new();
        for _ in 0..MAX_PAGES {
            tokio::time::advance(PAGE_FRESH_FOR).await;
            limiter.decide(&request).await.unwrap();
            let answer = metrics(State(state.clone())).await;
            assert_eq!(answer.status(), StatusCode::OK);
            unread.push(answer);
        }
        tokio::time::advance(PAGE_FRESH_FOR).await;
        limiter.decide(&request).await.unwrap();
        let stale = page(metrics(State(state.clone())).await).await;
        let newest = page(unread.pop().unwrap()).await;
        assert_eq!(
            stale, newest,
            "every page held: the newest is shared, no page more"
        );
        let fresh = page(metrics(State(state.clone())).await).await;
        assert_ne!(fresh, newest, "a page given back: rendered anew");
    }
}
