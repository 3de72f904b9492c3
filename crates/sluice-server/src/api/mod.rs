//! The service's HTTP API: Envoy's `/json`, Sluice's `/v1/check`, and the admin and operations
//! endpoints every Sluice listener serves (`sluice_http::admin`).

mod check;
mod envoy_json;
mod json_request;

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::de::DeserializeOwned;
use sluice_http::admin::{self, AdminState};
use sluice_http::problem::Problem;
use sluice_limiter::limits::MAX_BODY;
use sluice_limiter::{HeaderStyle, LimitRequest, Limiter, Verdict};

/// What the HTTP handlers share.
#[derive(Debug, Clone)]
pub struct ApiState {
    /// The limiter.
    pub limiter: Arc<Limiter>,
    /// A bearer token that opens the admin endpoints to non-loopback peers.
    pub admin_token: Option<Arc<str>>,
    /// Which rate-limit headers `/v1/check` answers carry.
    pub headers: HeaderStyle,
    /// The service-wide settings envoyproxy/ratelimit applies to `/json` answers.
    pub envoy: crate::compat::EnvoyAnswers,
}

/// The router. Serve it with `into_make_service_with_connect_info::<SocketAddr>()`, which the
/// admin endpoints need to tell loopback peers apart.
pub fn router(state: ApiState) -> Router {
    let admin = admin::router(AdminState {
        limiter: state.limiter.clone(),
        admin_token: state.admin_token.clone(),
    });
    Router::new()
        .route("/json", post(envoy_json::envoy_json))
        .route("/v1/check", post(check::check))
        .route("/healthcheck", get(healthcheck))
        .with_state(state)
        .merge(admin)
        .fallback(|| async {
            Problem::new(
                StatusCode::NOT_FOUND,
                "no such endpoint; see docs/openapi.yaml",
            )
        })
}

/// Reads a JSON body of at most [`MAX_BODY`] bytes into `T`, naming the field at fault.
async fn read_json<T: DeserializeOwned>(body: Body) -> Result<T, Problem> {
    let bytes: Bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| body_problem(&e))?;
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

/// A body that could not be read: too large (413), or malformed on the wire, such as a broken
/// chunked encoding or a connection that ended early (400).
fn body_problem(e: &axum::Error) -> Problem {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is larger than {MAX_BODY} bytes"),
            );
        }
        source = err.source();
    }
    Problem::bad_request(format!("the body could not be read: {e}"))
}

/// A request as read and decided.
struct Decided {
    request: LimitRequest,
    /// The request-level cost as sent, 0 when unset.
    sent_cost: u64,
    verdict: Verdict,
}

/// Reads a request body and decides it.
async fn decide(state: &ApiState, body: Body) -> Result<Decided, Problem> {
    let (request, sent_cost) = read_json::<json_request::JsonRequest>(body)
        .await?
        .into_limit_request()?;
    let verdict = state
        .limiter
        .decide(&request)
        .await
        .map_err(|e| Problem::bad_request(e.to_string()))?;
    Ok(Decided {
        request,
        sent_cost,
        verdict,
    })
}

/// envoyproxy/ratelimit's health check: OK while the service serves, unless it must have rules
/// and has none.
async fn healthcheck(
    axum::extract::State(state): axum::extract::State<ApiState>,
) -> (StatusCode, &'static str) {
    if state.envoy.healthy_needs_rules && state.limiter.reloader().rules().domain_names().is_empty()
    {
        (StatusCode::INTERNAL_SERVER_ERROR, "no rules loaded")
    } else {
        (StatusCode::OK, "OK")
    }
}

fn status_of(verdict: &Verdict) -> StatusCode {
    if verdict.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    }
}
