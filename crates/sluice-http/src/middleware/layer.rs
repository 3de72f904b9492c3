//! [`SharedLimitLayer`]: how the middleware is configured.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use http::request::Parts;
use sluice_core::{DynStore, OnStoreError, Policy};
use sluice_rules::{
    Action, Cidr, DescriptorConfig, DomainConfig, LimitConfig, Location, Reloader, RuleSet,
    ValueMatch,
};
use tower_layer::Layer;

use super::service::SharedLimit;
use crate::client_ip::{ForwardedHeader, client_ip};
use crate::enforce::{DEFAULT_MAX_DELAYED, Enforcer};
use crate::extract::{Extracted, extract};
use sluice_limiter::{HeaderStyle, LimitRequest, Limiter, Metrics, RequestDescriptor};

/// The socket peer of a request, as a request extension. [`crate::serve::serve_connections`]
/// sets it; under axum the layer also reads `ConnectInfo<SocketAddr>` (with the `axum`
/// feature). Without either, the client IP is unknown and reads as `0.0.0.0`.
///
/// With the `axum` feature it is also an extractor, which reads either, so that a handler works
/// both behind `serve_connections` and under `into_make_service_with_connect_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

#[cfg(feature = "axum")]
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for PeerAddr {
    type Rejection = (http::StatusCode, &'static str);

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        if let Some(peer) = parts.extensions.get::<PeerAddr>() {
            return Ok(*peer);
        }
        match parts
            .extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
        {
            Some(axum::extract::ConnectInfo(a)) => Ok(PeerAddr(*a)),
            None => Err((
                http::StatusCode::INTERNAL_SERVER_ERROR,
                "the peer address is unknown: serve with serve_connections or \
                 into_make_service_with_connect_info",
            )),
        }
    }
}

/// The domain of the rule set [`SharedLimitLayer::with_policy`] builds.
const POLICY_DOMAIN: &str = "layer";
/// The descriptor key its requests carry.
const POLICY_KEY: &str = "key";

/// Builds the limit request of an HTTP request, given its parts and client IP; `None` leaves
/// the request unlimited.
pub type KeyExtractor = dyn Fn(&Parts, IpAddr) -> Option<Extracted> + Send + Sync;

/// How requests become limit requests.
#[derive(Clone)]
enum Keys {
    /// The `routes` of the rules in force, as the gateway uses them.
    Routes,
    /// A closure of the application's own.
    Custom(Arc<KeyExtractor>),
}

/// What every clone shares.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) enforcer: Enforcer,
    keys: Keys,
    /// Trusted proxies beyond those in the rules (the gateway's `--trusted-proxy`).
    extra_trusted: Vec<Cidr>,
    /// The forwarding header the trusted proxies write, the only one read.
    forwarded_header: ForwardedHeader,
}

impl Shared {
    /// The limit request of `parts`, if it is limited, from `peer` (else the request's own).
    pub(crate) fn extract(&self, parts: &Parts, peer: Option<IpAddr>) -> Option<Extracted> {
        let peer = peer.unwrap_or_else(|| peer_ip(parts));
        self.enforcer.limiter().reloader().with_rules(|rules| {
            let gateway = rules.gateway();
            let from_rules = gateway
                .map(|g| g.trusted_proxies.as_slice())
                .unwrap_or_default();
            // The rules' proxies alone (the usual case) are read where they are, without a
            // copy per request.
            let client = if self.extra_trusted.is_empty() {
                client_ip(peer, &parts.headers, from_rules, self.forwarded_header)
            } else {
                let trusted: Vec<Cidr> = from_rules
                    .iter()
                    .chain(&self.extra_trusted)
                    .copied()
                    .collect();
                client_ip(peer, &parts.headers, &trusted, self.forwarded_header)
            };
            match &self.keys {
                Keys::Routes => extract(gateway?, parts, client),
                Keys::Custom(f) => f(parts, client),
            }
        })
    }
}

fn peer_ip(parts: &Parts) -> IpAddr {
    if let Some(PeerAddr(a)) = parts.extensions.get::<PeerAddr>() {
        return a.ip();
    }
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(a)) = parts
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return a.ip();
    }
    IpAddr::V4(Ipv4Addr::UNSPECIFIED)
}

/// Rate-limits the services it wraps, with the rules' actions and rate-limit fields.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use sluice_core::MemoryStore;
/// use sluice_http::SharedLimitLayer;
/// use sluice_limiter::{Limiter, Metrics};
/// use sluice_rules::Reloader;
///
/// let rules = Reloader::new(vec!["examples/gateway.yaml".into()])?;
/// let limiter = Arc::new(Limiter::new(rules, Arc::new(MemoryStore::new()), Arc::new(Metrics::new())));
/// let app: axum::Router = axum::Router::new()
///     .route("/api/hello", axum::routing::get(|| async { "hello" }))
///     .layer(SharedLimitLayer::new(limiter));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SharedLimitLayer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SharedLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedLimitLayer").finish_non_exhaustive()
    }
}

impl SharedLimitLayer {
    /// Limits requests by the `routes` of the limiter's rules, exactly as `sluice proxy` does.
    pub fn new(limiter: Arc<Limiter>) -> Self {
        Self::build(limiter, Keys::Routes)
    }

    /// Limits requests by the application's own extractor, checked against the limiter's rules.
    pub fn with_extractor<F>(limiter: Arc<Limiter>, extractor: F) -> Self
    where
        F: Fn(&Parts, IpAddr) -> Option<Extracted> + Send + Sync + 'static,
    {
        Self::build(limiter, Keys::Custom(Arc::new(extractor)))
    }

    /// Limits requests by one `policy`, per key: `key` names the counter a request counts
    /// against (its client IP, user, API key…), or `None` to let it pass unlimited. No rules
    /// file is needed; refusals are `reject`s with the usual headers, and a store error admits.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sluice_core::{MemoryStore, Policy, Rate, TokenBucket};
    /// use sluice_http::SharedLimitLayer;
    ///
    /// let policy = Policy::from(TokenBucket::new(20, Rate::per_second(10)).unwrap());
    /// let layer = SharedLimitLayer::with_policy(policy, Arc::new(MemoryStore::new()), |parts, ip| {
    ///     let user = parts.headers.get("x-user").and_then(|v| v.to_str().ok());
    ///     Some(user.map_or_else(|| ip.to_string(), str::to_owned))
    /// });
    /// let app: axum::Router = axum::Router::new()
    ///     .route("/", axum::routing::get(|| async { "hello" }))
    ///     .layer(layer);
    /// ```
    pub fn with_policy<F>(policy: Policy, store: Arc<dyn DynStore>, key: F) -> Self
    where
        F: Fn(&Parts, IpAddr) -> Option<String> + Send + Sync + 'static,
    {
        let location = Location::start_of(Arc::from("SharedLimitLayer::with_policy"));
        let limit = LimitConfig {
            name: Some(Arc::from("limit")),
            policy: Arc::new(policy),
            replaces: Vec::new(),
            action: Action::Reject,
            shadow: false,
            on_store_error: OnStoreError::Allow,
            location: location.clone(),
        };
        let domain = DomainConfig {
            name: POLICY_DOMAIN.to_owned(),
            location: location.clone(),
            descriptors: vec![DescriptorConfig {
                key: POLICY_KEY.to_owned(),
                value: ValueMatch::Any,
                location,
                limits: vec![limit],
                unlimited: false,
                detailed_metric: false,
                share_threshold: false,
                value_to_metric: false,
                quota_mode: false,
                metadata: None,
                descriptors: Vec::new(),
            }],
            gateway: None,
        };
        let rules = Reloader::fixed(RuleSet::from_domains([domain]));
        let limiter = Arc::new(Limiter::new(rules, store, Arc::new(Metrics::new())));
        Self::with_extractor(limiter, move |parts, ip| {
            let descriptor = RequestDescriptor {
                entries: vec![(POLICY_KEY.to_owned(), key(parts, ip)?)],
                cost: None,
                limit_override: None,
                envoy_hits: false,
                refund: false,
            };
            Some(Extracted {
                request: LimitRequest {
                    domain: POLICY_DOMAIN.to_owned(),
                    descriptors: vec![descriptor],
                    cost: 1,
                },
                style: HeaderStyle::Ietf,
            })
        })
    }

    fn build(limiter: Arc<Limiter>, keys: Keys) -> Self {
        SharedLimitLayer {
            shared: Arc::new(Shared {
                enforcer: Enforcer::new(limiter, DEFAULT_MAX_DELAYED),
                keys,
                extra_trusted: Vec::new(),
                forwarded_header: ForwardedHeader::default(),
            }),
        }
    }

    /// At most `n` requests wait in `delay` at once; more are rejected.
    pub fn max_delayed(mut self, n: usize) -> Self {
        let shared = Arc::make_mut(&mut self.shared);
        shared.enforcer = Enforcer::new(shared.enforcer.limiter().clone(), n);
        self
    }

    /// Also trusts forwarding headers from these proxies, beyond the rules' `trusted_proxies`.
    pub fn trust_proxies(mut self, cidrs: impl IntoIterator<Item = Cidr>) -> Self {
        Arc::make_mut(&mut self.shared).extra_trusted.extend(cidrs);
        self
    }

    /// Reads the client's address from `header`, the one the trusted proxies write (by
    /// default `X-Forwarded-For`); the other forwarding header is ignored.
    pub fn client_ip_header(mut self, header: ForwardedHeader) -> Self {
        Arc::make_mut(&mut self.shared).forwarded_header = header;
        self
    }

    /// The limit request of `parts` and its header style, as the layer builds it before
    /// deciding: its route's descriptors or the application's extractor, with the client IP
    /// read behind the trusted proxies. `None` leaves the request unlimited.
    pub fn extract(&self, parts: &Parts) -> Option<Extracted> {
        self.shared.extract(parts, None)
    }

    /// As [`extract`](Self::extract), for a request from `peer` (a service made for one
    /// connection knows it), without reading the request's `PeerAddr` or `ConnectInfo`.
    pub fn extract_from(&self, parts: &Parts, peer: IpAddr) -> Option<Extracted> {
        self.shared.extract(parts, Some(peer))
    }

    /// The enforcer every clone shares.
    pub fn enforcer(&self) -> &Enforcer {
        &self.shared.enforcer
    }
}

impl<S> Layer<S> for SharedLimitLayer {
    type Service = SharedLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SharedLimit::new(inner, self.shared.clone())
    }
}
