//! [`RateLimitLayer`]: how the middleware is configured.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use http::request::Parts;
use sluice_rules::Cidr;
use tower_layer::Layer;

use super::service::RateLimit;
use crate::client_ip::client_ip;
use crate::enforce::{DEFAULT_MAX_DELAYED, Enforcer};
use crate::extract::{Extracted, extract};
use crate::limiter::Limiter;

/// The socket peer of a request, as a request extension. The gateway sets it; under axum the
/// layer also reads `ConnectInfo<SocketAddr>` (with the `axum` feature). Without either, the
/// client IP is unknown and reads as `0.0.0.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

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
}

impl Shared {
    /// The limit request of `parts`, if it is limited.
    pub(crate) fn extract(&self, parts: &Parts) -> Option<Extracted> {
        let peer = peer_ip(parts);
        let rules = self.enforcer.limiter().reloader().rules();
        let gateway = rules.gateway();
        let trusted: Vec<Cidr> = gateway
            .map(|g| g.trusted_proxies.as_slice())
            .unwrap_or_default()
            .iter()
            .chain(&self.extra_trusted)
            .copied()
            .collect();
        let client = client_ip(peer, &parts.headers, &trusted);
        match &self.keys {
            Keys::Routes => extract(gateway?, parts, client),
            Keys::Custom(f) => f(parts, client),
        }
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
/// use sluice_http::{Limiter, Metrics, RateLimitLayer};
/// use sluice_rules::Reloader;
///
/// let rules = Reloader::new(vec!["examples/gateway.yaml".into()])?;
/// let limiter = Arc::new(Limiter::new(rules, Arc::new(MemoryStore::new()), Arc::new(Metrics::new())));
/// let app: axum::Router = axum::Router::new()
///     .route("/api/hello", axum::routing::get(|| async { "hello" }))
///     .layer(RateLimitLayer::new(limiter));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer").finish_non_exhaustive()
    }
}

impl RateLimitLayer {
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

    fn build(limiter: Arc<Limiter>, keys: Keys) -> Self {
        RateLimitLayer {
            shared: Arc::new(Shared {
                enforcer: Enforcer::new(limiter, DEFAULT_MAX_DELAYED),
                keys,
                extra_trusted: Vec::new(),
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

    /// The enforcer every clone shares.
    pub fn enforcer(&self) -> &Enforcer {
        &self.shared.enforcer
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.shared.clone())
    }
}
