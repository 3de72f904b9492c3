//! The service's HTTP API: Envoy's `/json`, Sluice's `/v1/check`, and the admin and operations
//! endpoints every Sluice listener serves (`sluice_http::admin`).

mod check;
mod envoy_json;
mod json_out;
mod json_request;
mod reserve;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::{BodyExt, Limited};
use serde::de::DeserializeOwned;
use sluice_http::PeerAddr;
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
    /// envoyproxy/ratelimit's statistics, which `/json` decisions count in, when kept.
    pub envoy_stats: Option<Arc<crate::envoy_stats::EnvoyStats>>,
}

/// The service `sluice serve` answers HTTP with: [`router`], except that the decision and usage
/// endpoints (`POST` to `/json`, `/v1/check`, `/v1/reserve` and `/v1/settle`) are called
/// directly, without the router's matching, its extensions and its boxed body, which cost more
/// than the JSON they answer. Every other request (a decision endpoint under another method included) goes through the
/// router, so its answers, 404 and 405 among them, are the router's.
#[derive(Debug, Clone)]
pub struct ApiService {
    /// Shared, so that a request's copy is one reference count, not the settings' strings.
    state: Arc<ApiState>,
    router: Router,
    /// The connection's peer, when served by connection ([`for_peer`](Self::for_peer)): the
    /// router's requests are given it as `PeerAddr`, which the admin endpoints read; the
    /// decision endpoints never need it, and are spared the extension.
    peer: Option<SocketAddr>,
}

impl ApiService {
    /// The service over `state`.
    pub fn new(state: ApiState) -> Self {
        ApiService {
            router: router(state.clone()),
            state: Arc::new(state),
            peer: None,
        }
    }

    /// The service for one connection from `peer`, for `serve_connections_with`.
    pub fn for_peer(&self, peer: SocketAddr) -> Self {
        ApiService {
            peer: Some(peer),
            ..self.clone()
        }
    }

    /// Whether a request for `method` and `path` is answered from its body alone (the
    /// decision and usage endpoints, [`call`](tower_service::Service::call)'s direct ones): its
    /// header fields are never read, and the listener need not hand them over
    /// (`sluice_http::h1_server::Fields`).
    pub fn reads_body_only(method: &Method, path: &[u8]) -> bool {
        Direct::of(method, path).is_some()
    }
}

/// The endpoints [`ApiService`] answers itself, from the body alone.
#[derive(Debug, Clone, Copy)]
enum Direct {
    Json,
    Check,
    Reserve,
    Settle,
}

impl Direct {
    /// The endpoint a request for `method` and `path` is, if it is one of these.
    fn of(method: &Method, path: &[u8]) -> Option<Direct> {
        if method != Method::POST {
            return None;
        }
        match path {
            b"/json" => Some(Direct::Json),
            b"/v1/check" => Some(Direct::Check),
            b"/v1/reserve" => Some(Direct::Reserve),
            b"/v1/settle" => Some(Direct::Settle),
            _ => None,
        }
    }
}

/// A request body the API reads.
trait ApiBody: http_body::Body<Data = Bytes, Error: Into<axum::BoxError>> + Send + 'static {}

impl<B> ApiBody for B where
    B: http_body::Body<Data = Bytes, Error: Into<axum::BoxError>> + Send + 'static
{
}

impl<B> tower_service::Service<Request<B>> for ApiService
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The router is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        if let Some(endpoint) = Direct::of(request.method(), request.uri().path().as_bytes()) {
            let state = Arc::clone(&self.state);
            // Each answer's future holds the body only: the request's head is dropped here, not
            // carried into the future (which is moved into its box) and dropped from there.
            let body = request.into_body();
            return match endpoint {
                Direct::Json => {
                    Box::pin(
                        async move { Ok(envoy_json::answer(&state, body).await.into_response()) },
                    )
                }
                Direct::Check => {
                    Box::pin(async move { Ok(check::answer(&state, body).await.into_response()) })
                }
                Direct::Reserve => {
                    Box::pin(
                        async move { Ok(reserve::reserve(&state, body).await.into_response()) },
                    )
                }
                Direct::Settle => {
                    Box::pin(async move { Ok(reserve::settle(&state, body).await.into_response()) })
                }
            };
        }
        if let Some(peer) = self.peer {
            request.extensions_mut().insert(PeerAddr(peer));
        }
        Box::pin(tower_service::Service::call(&mut self.router, request))
    }
}

/// The router. Serve it with `into_make_service_with_connect_info::<SocketAddr>()`, which the
/// admin endpoints need to tell loopback peers apart.
pub fn router(state: ApiState) -> Router {
    let admin = admin::router(AdminState {
        limiter: state.limiter.clone(),
        admin_token: state.admin_token.clone(),
    });
    Router::new()
        .route(
            "/json",
            post(
                |State(state): State<ApiState>, body: axum::body::Body| async move {
                    envoy_json::answer(&state, body).await
                },
            ),
        )
        .route(
            "/v1/check",
            post(
                |State(state): State<ApiState>, body: axum::body::Body| async move {
                    check::answer(&state, body).await
                },
            ),
        )
        .route(
            "/v1/reserve",
            post(
                |State(state): State<ApiState>, body: axum::body::Body| async move {
                    reserve::reserve(&state, body).await
                },
            ),
        )
        .route(
            "/v1/settle",
            post(
                |State(state): State<ApiState>, body: axum::body::Body| async move {
                    reserve::settle(&state, body).await
                },
            ),
        )
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

/// A body as text: JSON is UTF-8 (RFC 8259), and checking the body once lets the parsers read
/// it as `str`, which serde_json does not check again string by string.
fn body_text(bytes: &[u8]) -> Result<&str, Problem> {
    std::str::from_utf8(bytes)
        .map_err(|e| Problem::bad_request(format!("invalid JSON: the body is not UTF-8: {e}")))
}

/// Parses a JSON body into `T`, naming the field at fault.
fn parse_json<T: DeserializeOwned>(text: &str) -> Result<T, Problem> {
    // Plain parsing is the fast path; only a body that fails is parsed again, tracking the
    // path, to name the field at fault.
    if let Ok(value) = serde_json::from_str(text) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        Problem::bad_request(format!("invalid JSON: {}", e.inner())).with_field(field)
    })?;
    de.end()
        .map_err(|e| Problem::bad_request(format!("invalid JSON: {e}")))?;
    Ok(value)
}

/// Reads a whole body of at most [`MAX_BODY`] bytes. A body that arrives in one frame, as a
/// small JSON body does, is that frame: no buffer list, no copy.
async fn collect_body(body: impl ApiBody) -> Result<Bytes, Problem> {
    let mut body = std::pin::pin!(Limited::new(body, MAX_BODY));
    let mut first: Option<Bytes> = None;
    let mut joined: Option<Vec<u8>> = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|e| body_problem(&*e))?.into_data() else {
            continue; // trailers: nothing to read
        };
        match (&first, &mut joined) {
            (None, _) => first = Some(data),
            (Some(f), None) => {
                let mut all = Vec::with_capacity(f.len() + data.len());
                all.extend_from_slice(f);
                all.extend_from_slice(&data);
                joined = Some(all);
            }
            (Some(_), Some(all)) => all.extend_from_slice(&data),
        }
        // A body of known length that has arrived whole says so: not asking for a frame more
        // spares hyper's body channel a poll (about 150 instructions of a `/json` answer).
        if http_body::Body::is_end_stream(&*body) {
            break;
        }
    }
    Ok(match (joined, first) {
        (Some(all), _) => Bytes::from(all),
        (None, Some(one)) => one,
        (None, None) => Bytes::new(),
    })
}

/// A body that could not be read: too large (413), or malformed on the wire, such as a broken
/// chunked encoding or a connection that ended early (400).
fn body_problem(e: &(dyn std::error::Error + Send + Sync + 'static)) -> Problem {
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
async fn decide(state: &ApiState, body: impl ApiBody) -> Result<Decided, Problem> {
    let bytes = collect_body(body).await?;
    let text = body_text(&bytes)?;
    // The body as clients send it is read by hand; anything else by serde, which names a fault.
    let json = match json_request::JsonRequest::parse_plain(text) {
        Some(json) => json,
        None => parse_json::<json_request::JsonRequest>(text)?,
    };
    let (request, sent_cost) = json.into_limit_request()?;
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
async fn healthcheck(State(state): State<ApiState>) -> (StatusCode, &'static str) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the endpoints answered from the body alone go without fields: a `GET`, another
    /// path (the admin endpoints, `POST /v1/reload` among them, read `Authorization`), or a longer one keeps them.
    #[test]
    fn only_the_decision_and_usage_endpoints_go_without_fields() {
        for path in ["/json", "/v1/check", "/v1/reserve", "/v1/settle"] {
            assert!(
                ApiService::reads_body_only(&Method::POST, path.as_bytes()),
                "{path}"
            );
            assert!(
                !ApiService::reads_body_only(&Method::GET, path.as_bytes()),
                "{path}"
            );
            assert!(
                !ApiService::reads_body_only(&Method::PUT, path.as_bytes()),
                "{path}"
            );
            let longer = format!("{path}/x");
            assert!(
                !ApiService::reads_body_only(&Method::POST, longer.as_bytes()),
                "{longer}"
            );
        }
        for path in [
            "/",
            "/healthcheck",
            "/v1/reload",
            "/v1/overrides/d",
            "/JSON",
            "/json/",
        ] {
            assert!(
                !ApiService::reads_body_only(&Method::POST, path.as_bytes()),
                "{path}"
            );
        }
    }
}
