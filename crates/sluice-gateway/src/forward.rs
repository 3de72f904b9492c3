//! Forwarding a request that the limits let through: the target on the upstream, hop-by-hop
//! fields dropped as RFC 9110 §7.6.1 asks, `X-Forwarded-For` appended, and an error answer of
//! the gateway's own when the upstream fails or is late.

use std::cell::RefCell;
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{FutureExt, future};
use http::header::{
    CONNECTION, CONTENT_TYPE, Entry, HOST, HeaderName, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TE,
    TRAILER, TRANSFER_ENCODING, UPGRADE,
};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::{Either, Full};
use sluice_http::PeerAddr;
use sluice_http::RequestBody as ClientBody;
use sluice_http::client_ip::{X_FORWARDED_FOR, push_ip};
use tower_service::Service;

use crate::upstream_body::UpstreamBody;
use crate::upstream_pool::{UpstreamError, UpstreamPool};
use crate::{GatewayError, GatewayOptions};

/// The body the gateway answers with: the upstream's, streamed, or one of its own.
pub type GatewayBody = Either<UpstreamBody, Full<Bytes>>;

/// The body the gateway sends upstream: the client's, streamed, or the bytes it read to find a
/// reservation's estimate, forwarded as they came.
pub(crate) type RequestBody = Either<ClientBody, Full<Bytes>>;

/// Forwards requests to the upstream. Cheap to clone: clones share one [`Target`].
#[derive(Clone)]
pub(crate) struct Forward {
    target: Arc<Target>,
    /// The client's address when this service serves one connection ([`Forward::for_peer`]),
    /// for `X-Forwarded-For`; otherwise the request's `PeerAddr`.
    peer: Option<IpAddr>,
}

/// Why a request got no answer from the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The request target cannot be forwarded: the upstream never saw it.
    BadTarget,
    /// No connection could be made: the upstream never saw it.
    Unreachable,
    /// The connection failed while the request was sent or its answer read.
    Broken,
    /// The upstream did not start answering in time.
    TimedOut,
}

impl Failure {
    /// Whether the upstream may have received the request, and so done work for it.
    pub(crate) fn reached_upstream(self) -> bool {
        matches!(self, Failure::Broken | Failure::TimedOut)
    }

    /// The gateway's own answer.
    pub(crate) fn response(self) -> Response<GatewayBody> {
        match self {
            Failure::BadTarget => error(
                StatusCode::BAD_REQUEST,
                "the request target cannot be forwarded",
            ),
            Failure::Unreachable => error(
                StatusCode::BAD_GATEWAY,
                "the upstream is unreachable; it refused or did not accept the connection",
            ),
            Failure::Broken => error(
                StatusCode::BAD_GATEWAY,
                "the upstream closed the connection or sent an invalid answer",
            ),
            Failure::TimedOut => error(
                StatusCode::GATEWAY_TIMEOUT,
                "the upstream did not answer in time",
            ),
        }
    }
}

/// Where requests go and how long they may take.
struct Target {
    pool: Arc<UpstreamPool>,
    scheme: Scheme,
    authority: Authority,
    /// The upstream's base path, without a trailing slash ("" for none).
    base: Box<str>,
    /// h2 takes the target as an absolute URI; HTTP/1.1 in origin form, with `Host`.
    h2: bool,
    timeout: Duration,
}

impl Forward {
    pub(crate) fn new(options: &GatewayOptions) -> Result<Self, GatewayError> {
        let bad = || GatewayError::BadUpstream(options.upstream.to_string());
        let scheme = options.upstream.scheme().cloned().ok_or_else(bad)?;
        if scheme != Scheme::HTTP {
            return Err(bad());
        }
        let authority = options.upstream.authority().cloned().ok_or_else(bad)?;
        let address = format!(
            "{}:{}",
            authority.host(),
            authority.port_u16().unwrap_or(80)
        );
        Ok(Forward {
            peer: None,
            target: Arc::new(Target {
                pool: Arc::new(UpstreamPool::new(
                    address,
                    options.connect_timeout,
                    options.upstream_h2,
                )),
                scheme,
                authority,
                base: options.upstream.path().trim_end_matches('/').into(),
                h2: options.upstream_h2,
                timeout: options.upstream_timeout,
            }),
        })
    }

    /// This service for the requests of one connection from `peer`.
    pub(crate) fn for_peer(&self, peer: IpAddr) -> Self {
        Forward {
            target: Arc::clone(&self.target),
            peer: Some(peer),
        }
    }

    /// Sends `request` upstream: the answer's head, its body streaming, or why there is none.
    pub(crate) fn send(
        &self,
        request: Request<RequestBody>,
    ) -> impl Future<Output = Result<Response<UpstreamBody>, Failure>> + Send + 'static {
        self.target.forward(request, self.peer)
    }
}

impl Target {
    /// The target to ask the upstream for: the base path, then the client's path and query.
    fn upstream_uri(&self, uri: &Uri) -> Option<Uri> {
        let pq = match uri.path_and_query() {
            // Shares the client's bytes: nothing to copy.
            Some(pq) if self.base.is_empty() => pq.clone(),
            pq => {
                let pq = pq.map_or("/", PathAndQuery::as_str);
                PathAndQuery::from_maybe_shared(Bytes::from(format!("{}{pq}", self.base))).ok()?
            }
        };
        let mut parts = http::uri::Parts::default();
        if self.h2 {
            parts.scheme = Some(self.scheme.clone());
            parts.authority = Some(self.authority.clone());
        }
        parts.path_and_query = Some(pq);
        Uri::from_parts(parts).ok()
    }

    /// Sends `request` upstream, `X-Forwarded-For` naming `peer` (else the request's `PeerAddr`).
    /// Not an `async fn`, for the reason `UpstreamPool::send` gives:
    /// the request is prepared here and handed on, so that the future holds it only once, in
    /// the pool's sending; the answer is looked at by [`answered`](Self::answered).
    fn forward(
        self: &Arc<Self>,
        mut request: Request<RequestBody>,
        peer: Option<IpAddr>,
    ) -> impl Future<Output = Result<Response<UpstreamBody>, Failure>> + Send + 'static {
        let peer = peer.or_else(|| request.extensions().get::<PeerAddr>().map(|p| p.0.ip()));
        let Some(uri) = self.upstream_uri(request.uri()) else {
            return future::Either::Left(future::ready(Err(Failure::BadTarget)));
        };
        // Keep the client's Host, as most APIs behind a gateway expect; h2 clients send
        // `:authority` instead, which becomes Host. HTTP/1.1 requires one, so a client that
        // sent neither gets the upstream's.
        if !request.headers().contains_key(HOST) {
            let host = request.uri().authority().unwrap_or(&self.authority);
            if let Ok(v) = HeaderValue::from_str(host.as_str()) {
                request.headers_mut().insert(HOST, v);
            }
        }
        *request.uri_mut() = uri;
        *request.version_mut() = if self.h2 {
            http::Version::HTTP_2
        } else {
            http::Version::HTTP_11
        };
        strip_hop_by_hop(request.headers_mut());
        if let Some(ip) = peer {
            append_forwarded_for(request.headers_mut(), ip);
        }
        let target = Arc::clone(self);
        future::Either::Right(
            self.pool
                .send(request, self.timeout)
                .map(move |answer| target.answered(answer)),
        )
    }

    /// The upstream's answer, its hop-by-hop fields gone, or why there is none.
    fn answered(
        &self,
        answer: Result<Response<UpstreamBody>, UpstreamError>,
    ) -> Result<Response<UpstreamBody>, Failure> {
        match answer {
            Ok(mut response) => {
                strip_hop_by_hop(response.headers_mut());
                Ok(response)
            }
            Err(e @ UpstreamError::Connect(_)) => {
                tracing::warn!(error = %e, upstream = %self.authority, "upstream unreachable");
                Err(Failure::Unreachable)
            }
            Err(UpstreamError::TimedOut) => {
                tracing::warn!(upstream = %self.authority, timeout = ?self.timeout, "upstream timed out");
                Err(Failure::TimedOut)
            }
            Err(e) => {
                tracing::warn!(error = %e, upstream = %self.authority, "upstream failed");
                Err(Failure::Broken)
            }
        }
    }
}

impl Service<Request<ClientBody>> for Forward {
    type Response = Response<GatewayBody>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>,
    >;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ClientBody>) -> Self::Future {
        Box::pin(self.send(request.map(Either::Left)).map(|answer| {
            Ok(match answer {
                Ok(response) => response.map(Either::Left),
                Err(failure) => failure.response(),
            })
        }))
    }
}

/// A gateway error answer, as `application/problem+json`.
pub(crate) fn error(status: StatusCode, detail: &str) -> Response<GatewayBody> {
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
/// forwarded, and `Transfer-Encoding`: framing is the connection's business, and hyper sets it
/// anew for each side.
static HOP_BY_HOP: [HeaderName; 9] = [
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    PROXY_AUTHENTICATE,
    PROXY_AUTHORIZATION,
    TE,
    TRAILER,
    UPGRADE,
    TRANSFER_ENCODING,
];

/// `X-Forwarded-For`, parsed once rather than on every lookup.
static FORWARDED_FOR: HeaderName = HeaderName::from_static(X_FORWARDED_FOR);

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none of them: one pass over the names, each told apart by its text
    // (a jump on its length and one comparison) instead of against every name in turn.
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named.iter().chain(&HOP_BY_HOP) {
        headers.remove(n);
    }
}

/// Whether `name` is one of [`HOP_BY_HOP`].
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "upgrade"
            | "transfer-encoding"
    )
}

/// Adds the peer to `X-Forwarded-For`, after whatever the client sent, as one field.
fn append_forwarded_for(headers: &mut HeaderMap, ip: IpAddr) {
    match headers.entry(&FORWARDED_FOR) {
        // The usual case, a client that sent none: the peer alone, written once per peer.
        Entry::Vacant(field) => {
            if let Some(v) = peer_field(ip) {
                field.insert(v);
            }
        }
        Entry::Occupied(mut field) => {
            let mut value = String::with_capacity(48);
            for prior in field.iter() {
                if let Ok(prior) = prior.to_str() {
                    value.push_str(prior);
                    value.push_str(", ");
                }
            }
            push_ip(&mut value, ip);
            if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(value)) {
                field.insert(v);
            }
        }
    }
}

thread_local! {
    /// The last peer seen on this thread and its address as a field value. A kept-alive
    /// connection's requests, and those of the few load balancers in front of a gateway, come
    /// from one address: its text is written and checked once, then shared.
    static LAST_PEER: RefCell<Option<(IpAddr, HeaderValue)>> = const { RefCell::new(None) };
}

/// `ip` as an `X-Forwarded-For` value, as `Display` writes it.
fn peer_field(ip: IpAddr) -> Option<HeaderValue> {
    LAST_PEER.with(|last| {
        let mut last = last.borrow_mut();
        if let Some((seen, field)) = last.as_ref()
            && *seen == ip
        {
            return Some(field.clone());
        }
        let mut text = String::with_capacity(45);
        push_ip(&mut text, ip);
        let field = HeaderValue::from_maybe_shared(Bytes::from(text)).ok()?;
        *last = Some((ip, field.clone()));
        Some(field)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    /// The future every forwarded request moves into its box holds the request's parts once:
    /// as nested `async fn`s it held the request or its parts six times over (2,160 bytes for
    /// `Target::forward`, 2,440 with its caller's block; 920 now).
    #[test]
    fn a_forwarding_future_stays_small() {
        let options = GatewayOptions::new(Vec::new(), Uri::from_static("http://127.0.0.1:9"));
        let mut forward = Forward::new(&options).unwrap();
        let request = Request::builder()
            .uri("/api/items/1")
            .body(ClientBody::whole(Bytes::new()))
            .unwrap();
        let sending = forward.send(request.map(Either::Left));
        let size = std::mem::size_of_val(&sending);
        assert!(size <= 1_024, "{size} bytes");
        let request = Request::new(ClientBody::whole(Bytes::new()));
        let call = forward.call(request);
        // What the box holds: the forwarding future and what maps its answer.
        let boxed = std::mem::size_of_val(&*call);
        assert!(boxed <= 1_024, "{boxed} bytes");
    }

    #[test]
    fn hop_by_hop_fields_and_those_connection_names_are_dropped() {
        let mut h = headers(&[
            ("connection", "keep-alive, x-session-hop"),
            ("keep-alive", "timeout=5"),
            ("x-session-hop", "1"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("x-kept", "yes"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h["x-kept"], "yes");

        let mut plain = headers(&[("accept", "*/*"), ("x-kept", "yes")]);
        strip_hop_by_hop(&mut plain);
        assert_eq!(plain.len(), 2);
    }

    #[test]
    fn the_quick_test_knows_every_hop_by_hop_field_and_no_other() {
        for name in &HOP_BY_HOP {
            assert!(is_hop_by_hop(name), "{name}");
        }
        for name in [
            "accept",
            "host",
            "content-length",
            "x-connection",
            "t",
            "upgrades",
        ] {
            assert!(!is_hop_by_hop(&HeaderName::from_static(name)), "{name}");
        }
    }

    #[test]
    fn the_peer_is_appended_to_forwarded_for_as_display_writes_it() {
        for ip in [
            "0.0.0.0",
            "1.2.3.4",
            "10.20.100.255",
            "192.168.0.9",
            "2001:db8::1",
            "::ffff:1.2.3.4",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            // Twice: written, then shared from the last peer's.
            for _ in 0..2 {
                let mut h = HeaderMap::new();
                append_forwarded_for(&mut h, ip);
                assert_eq!(h[X_FORWARDED_FOR], ip.to_string().as_str());
            }
        }
        // Every field the client sent stays, in order, joined into one.
        let mut h = headers(&[
            ("x-forwarded-for", "203.0.113.7"),
            ("x-forwarded-for", "198.51.100.1, 10.0.0.2"),
        ]);
        append_forwarded_for(&mut h, "127.0.0.1".parse().unwrap());
        let all: Vec<_> = h.get_all(X_FORWARDED_FOR).iter().collect();
        assert_eq!(all, ["203.0.113.7, 198.51.100.1, 10.0.0.2, 127.0.0.1"]);
    }

    #[test]
    fn the_upstream_target_keeps_the_base_path_and_the_query() {
        let target = |upstream: &str, h2: bool| {
            let mut options = GatewayOptions::new(Vec::new(), upstream.parse().unwrap());
            options.upstream_h2 = h2;
            Forward::new(&options).unwrap().target
        };
        let plain = target("http://127.0.0.1:9000", false);
        let uri: Uri = "/a/b?x=1".parse().unwrap();
        assert_eq!(plain.upstream_uri(&uri).unwrap(), "/a/b?x=1");
        let absolute: Uri = "http://client.example/a?x=1".parse().unwrap();
        assert_eq!(plain.upstream_uri(&absolute).unwrap(), "/a?x=1");
        let based = target("http://127.0.0.1:9000/v1/", false);
        assert_eq!(based.upstream_uri(&uri).unwrap(), "/v1/a/b?x=1");
        let h2 = target("http://up.example:8080/v1", true);
        assert_eq!(
            h2.upstream_uri(&uri).unwrap(),
            "http://up.example:8080/v1/a/b?x=1"
        );
        assert!(matches!(
            Forward::new(&GatewayOptions::new(
                Vec::new(),
                "https://up.example".parse().unwrap()
            )),
            Err(GatewayError::BadUpstream(_))
        ));
    }
}
