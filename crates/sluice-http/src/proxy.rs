//! `sluice proxy`: a reverse proxy that limits requests by the rules' `routes` before they reach
//! the upstream, so the API behind it needs no change.
//!
//! It is the tower [`RateLimitLayer`] around a forwarding service: the gateway and the
//! middleware answer alike because they are the same code. Bodies are streamed both ways,
//! upstream connections are pooled and kept alive, clients may speak HTTP/1.1 or h2, and
//! hop-by-hop fields are dropped as RFC 9110 §7.6.1 asks.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_TYPE, HOST, HeaderName};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use sluice_rules::Cidr;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower_layer::Layer;
use tower_service::Service;

use crate::client_ip::X_FORWARDED_FOR;
use crate::enforce::DEFAULT_MAX_DELAYED;
use crate::limiter::Limiter;
use crate::middleware::{PeerAddr, RateLimitLayer};

/// How to run the gateway.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// Where it listens.
    pub listen: SocketAddr,
    /// The API behind it: `http://host:port`, optionally with a base path.
    pub upstream: Uri,
    /// How long the upstream may take to start answering before the client gets `504`.
    pub upstream_timeout: Duration,
    /// How long connecting to the upstream may take before the client gets `502`.
    pub connect_timeout: Duration,
    /// Speak h2 (prior knowledge) to the upstream instead of HTTP/1.1.
    pub upstream_h2: bool,
    /// At most this many requests wait in `delay` at once.
    pub max_delayed: usize,
    /// Proxies whose forwarding headers are believed, beyond the rules' `trusted_proxies`.
    pub trusted_proxies: Vec<Cidr>,
}

impl ProxyOptions {
    /// Defaults: listen on 127.0.0.1:8000, a 30 s upstream timeout, a 5 s connect timeout.
    pub fn new(upstream: Uri) -> Self {
        ProxyOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 8000)),
            upstream,
            upstream_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            upstream_h2: false,
            max_delayed: DEFAULT_MAX_DELAYED,
            trusted_proxies: Vec::new(),
        }
    }
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The upstream is not an `http://host[:port]` URL.
    #[error("upstream `{0}` is not usable; give it as http://host:port (https is not supported)")]
    Upstream(String),
    /// The listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// The body the gateway answers with: the upstream's, streamed, or one of its own.
pub type ProxyBody = Either<Incoming, Full<Bytes>>;

/// Forwards requests to the upstream.
#[derive(Clone)]
struct Forward {
    client: Client<HttpConnector, Incoming>,
    scheme: Scheme,
    authority: Authority,
    /// The upstream's base path, without a trailing slash ("" for none).
    base: Arc<str>,
    timeout: Duration,
}

impl Forward {
    fn new(options: &ProxyOptions) -> Result<Self, ProxyError> {
        let bad = || ProxyError::Upstream(options.upstream.to_string());
        let scheme = options.upstream.scheme().cloned().ok_or_else(bad)?;
        if scheme != Scheme::HTTP {
            return Err(bad());
        }
        let authority = options.upstream.authority().cloned().ok_or_else(bad)?;
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(options.connect_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .http2_only(options.upstream_h2)
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Ok(Forward {
            client,
            scheme,
            authority,
            base: Arc::from(options.upstream.path().trim_end_matches('/')),
            timeout: options.upstream_timeout,
        })
    }

    fn upstream_uri(&self, uri: &Uri) -> Option<Uri> {
        let pq = uri.path_and_query().map_or("/", PathAndQuery::as_str);
        let pq: PathAndQuery = format!("{}{pq}", self.base).parse().ok()?;
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(pq)
            .build()
            .ok()
    }

    async fn forward(self, mut request: Request<Incoming>) -> Response<ProxyBody> {
        let peer = request.extensions().get::<PeerAddr>().map(|p| p.0.ip());
        let Some(uri) = self.upstream_uri(request.uri()) else {
            return error(
                StatusCode::BAD_REQUEST,
                "the request target cannot be forwarded",
            );
        };
        // Keep the client's Host, as most APIs behind a gateway expect; h2 clients send
        // `:authority` instead, which becomes Host.
        if !request.headers().contains_key(HOST) {
            if let Some(a) = request.uri().authority() {
                if let Ok(v) = HeaderValue::from_str(a.as_str()) {
                    request.headers_mut().insert(HOST, v);
                }
            }
        }
        *request.uri_mut() = uri;
        *request.version_mut() = http::Version::HTTP_11;
        strip_hop_by_hop(request.headers_mut());
        if let Some(ip) = peer {
            append_forwarded_for(request.headers_mut(), ip);
        }
        match tokio::time::timeout(self.timeout, self.client.request(request)).await {
            Ok(Ok(mut response)) => {
                strip_hop_by_hop(response.headers_mut());
                response.map(Either::Left)
            }
            Ok(Err(e)) if e.is_connect() => {
                tracing::warn!(error = %e, upstream = %self.authority, "upstream unreachable");
                error(
                    StatusCode::BAD_GATEWAY,
                    "the upstream is unreachable; it refused or did not accept the connection",
                )
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, upstream = %self.authority, "upstream failed");
                error(
                    StatusCode::BAD_GATEWAY,
                    "the upstream closed the connection or sent an invalid answer",
                )
            }
            Err(_) => {
                tracing::warn!(upstream = %self.authority, timeout = ?self.timeout, "upstream timed out");
                error(
                    StatusCode::GATEWAY_TIMEOUT,
                    "the upstream did not answer in time",
                )
            }
        }
    }
}

impl Service<Request<Incoming>> for Forward {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>,
    >;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(request).await) })
    }
}

/// A gateway error answer, as `application/problem+json`.
fn error(status: StatusCode, detail: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut r = Response::new(Either::Right(Full::new(Bytes::from(body.to_string()))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    r
}

/// The hop-by-hop fields (RFC 9110 §7.6.1), which describe one connection and must not be
/// forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for n in HOP_BY_HOP {
        headers.remove(n);
    }
    // Framing is the connection's business; hyper sets it anew for each side.
    headers.remove(http::header::TRANSFER_ENCODING);
}

fn append_forwarded_for(headers: &mut HeaderMap, ip: std::net::IpAddr) {
    let prior: Vec<&str> = headers
        .get_all(X_FORWARDED_FOR)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let value = if prior.is_empty() {
        ip.to_string()
    } else {
        format!("{}, {ip}", prior.join(", "))
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(X_FORWARDED_FOR, v);
    }
}

/// A running gateway.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Binds `options.listen` and starts forwarding, limiting with `limiter`.
    pub async fn start(options: ProxyOptions, limiter: Arc<Limiter>) -> Result<Proxy, ProxyError> {
        let forward = Forward::new(&options)?;
        let layer = RateLimitLayer::new(limiter)
            .max_delayed(options.max_delayed)
            .trust_proxies(options.trusted_proxies.iter().copied());
        let service = layer.layer(forward);
        let listener =
            TcpListener::bind(options.listen)
                .await
                .map_err(|source| ProxyError::Bind {
                    addr: options.listen,
                    source,
                })?;
        let addr = listener.local_addr().unwrap_or(options.listen);
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let graceful = GracefulShutdown::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let (stream, peer) = match accepted {
                            Ok(a) => a,
                            Err(e) => {
                                tracing::warn!(error = %e, "accept failed");
                                continue;
                            }
                        };
                        let _ = stream.set_nodelay(true);
                        let service = service.clone();
                        let hyper_service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
                            request.extensions_mut().insert(PeerAddr(peer));
                            let mut service = service.clone();
                            async move {
                                std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
                                service.call(request).await
                            }
                        });
                        let connection = builder
                            .serve_connection(TokioIo::new(stream), hyper_service)
                            .into_owned();
                        let connection = graceful.watch(connection);
                        tokio::spawn(async move {
                            if let Err(e) = connection.await {
                                tracing::debug!(error = %e, %peer, "connection ended with an error");
                            }
                        });
                    }
                    _ = stopped.wait_for(|s| *s) => break,
                }
            }
            drop(listener);
            graceful.shutdown().await;
        });
        tracing::info!(%addr, upstream = %options.upstream, "sluice proxy is forwarding");
        Ok(Proxy { addr, stop, task })
    }

    /// Where the gateway listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets requests in flight finish, and returns when every connection has
    /// closed.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
