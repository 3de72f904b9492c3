//! `sluice proxy`: a reverse proxy that limits requests by the rules' `routes` before they reach
//! the upstream, so the API behind it needs no change.
//!
//! It is the tower [`SharedLimitLayer`] around a forwarding service: the gateway and the
//! middleware answer alike because they are the same code. A route with `usage` (a token
//! budget) instead reserves an estimate read from the request's JSON body and settles it with
//! the usage its answer reports, read from a JSON body or an event stream as it passes
//! ([`UsageBody`]; `docs/usage-limits.md`, "Gateway"). Bodies are streamed both ways,
//! upstream connections are pooled and kept alive, and clients may speak HTTP/1.1 or h2. Beside
//! the proxy listener, an admin listener serves `/metrics`, `/healthz`, `/readyz` and the admin
//! endpoints, as `sluice serve` does.
//!
//! The binary (`sluice proxy`) is a thin wrapper around [`Gateway::start`]:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use sluice_gateway::{Gateway, GatewayOptions};
//! let mut options = GatewayOptions::new(
//!     vec!["examples/gateway.yaml".into()],
//!     "http://127.0.0.1:3000".parse()?,
//! );
//! options.admin_addr = Some("127.0.0.1:9901".parse()?);
//! let gateway = Gateway::start(options).await?;
//! println!("forwarding on {}", gateway.local_addr());
//! gateway.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! [`SharedLimitLayer`]: sluice_http::SharedLimitLayer

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod answer_framing;
mod budget;
mod forward;
mod h1_connection;
mod metered;
mod upstream_body;
mod upstream_pool;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use sluice_http::admin::AdminState;
pub use sluice_http::client_ip::ForwardedHeader;
use sluice_http::lifecycle::{BindError, Lifecycle};
pub use sluice_http::serve::ConnectionLimits;
use sluice_http::{DEFAULT_MAX_DELAYED, SharedLimitLayer};
use sluice_limiter::{Limiter, StartError};
use sluice_rules::Cidr;
use sluice_stores::StoreSettings;

pub use budget::{AnswerMeter, UsageBody};
pub use forward::GatewayBody;
pub use metered::{BudgetBody, MeteredBody};
pub use upstream_body::UpstreamBody;

/// How to run the gateway.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    /// Rule files or directories; one of them holds the `routes`.
    pub config: Vec<PathBuf>,
    /// Where the proxy listens.
    pub listen: SocketAddr,
    /// Where `/metrics`, the health checks and the admin endpoints listen; `None` serves none.
    pub admin_addr: Option<SocketAddr>,
    /// The bearer token that opens the admin endpoints to non-loopback peers.
    pub admin_token: Option<String>,
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
    /// The forwarding header those proxies write; the only one read.
    pub client_ip_header: ForwardedHeader,
    /// How long clients may take to send a request head, and how idle h2 connections are
    /// checked, on the proxy and admin listeners.
    pub connections: ConnectionLimits,
    /// The store URL: `memory`, `memory://?max_keys=N` or a Redis URL.
    pub store: String,
    /// Key prefix and call timeout for a Redis store.
    pub store_settings: StoreSettings,
    /// How long rule files must be quiet before a change is reloaded.
    pub reload_debounce: Duration,
}

impl GatewayOptions {
    /// Defaults: listen on 127.0.0.1:8000 with no admin listener, the memory store, a 30 s
    /// upstream timeout and a 5 s connect timeout.
    pub fn new(config: Vec<PathBuf>, upstream: Uri) -> Self {
        GatewayOptions {
            config,
            listen: SocketAddr::from(([127, 0, 0, 1], 8000)),
            admin_addr: None,
            admin_token: None,
            upstream,
            upstream_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            upstream_h2: false,
            max_delayed: DEFAULT_MAX_DELAYED,
            trusted_proxies: Vec::new(),
            client_ip_header: ForwardedHeader::default(),
            connections: ConnectionLimits::default(),
            store: "memory".to_owned(),
            store_settings: StoreSettings::default(),
            reload_debounce: Duration::from_millis(250),
        }
    }
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The rules or the store could not be loaded.
    #[error(transparent)]
    Limiter(#[from] StartError),
    /// The upstream is not an `http://host[:port]` URL.
    #[error("upstream `{0}` is not usable; give it as http://host:port (https is not supported)")]
    BadUpstream(String),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

impl From<BindError> for GatewayError {
    fn from(e: BindError) -> Self {
        GatewayError::Bind {
            addr: e.addr,
            source: e.source,
        }
    }
}

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    limiter: Arc<Limiter>,
    /// Its listeners and tasks, and the rule files' watcher when it loaded them itself.
    lifecycle: Lifecycle,
}

impl Gateway {
    /// Opens the store, loads the rules (refusing any the store cannot hold, then and on every
    /// reload, each reload logged), binds the proxy and admin listeners and starts forwarding.
    pub async fn start(options: GatewayOptions) -> Result<Gateway, GatewayError> {
        let opened = sluice_stores::open(&options.store, &options.store_settings)
            .await
            .map_err(StartError::from)?;
        let mut lifecycle = Lifecycle::new(options.connections);
        let limiter = lifecycle.follow_files(
            options.config.clone(),
            sluice_rules::LoadOptions::default(),
            opened,
            options.reload_debounce,
        )?;
        if limiter
            .reloader()
            .rules()
            .gateway()
            .is_none_or(|g| g.routes.is_empty())
        {
            tracing::warn!("the rules have no `routes`; every request passes unlimited");
        }
        // The shared overrides are read before anything is forwarded, and followed after, as
        // `sluice serve` does.
        lifecycle.follow_overrides(&limiter).await;
        Self::serve(options, limiter, lifecycle).await
    }

    /// Starts forwarding with a limiter built by the caller, ignoring `options.config` and
    /// `options.store`: how tests run the gateway on a store with a fake clock, and how an
    /// embedder shares one limiter.
    pub async fn start_with_limiter(
        options: GatewayOptions,
        limiter: Arc<Limiter>,
    ) -> Result<Gateway, GatewayError> {
        let lifecycle = Lifecycle::new(options.connections);
        Self::serve(options, limiter, lifecycle).await
    }

    /// The proxy listener (the limit layer around forwarding), the dashboard's sampler, and the
    /// admin listener when `admin_addr` asks for one, bound after the proxy's.
    async fn serve(
        options: GatewayOptions,
        limiter: Arc<Limiter>,
        mut lifecycle: Lifecycle,
    ) -> Result<Gateway, GatewayError> {
        let forward = forward::Forward::new(&options)?;
        // Rules that load can still hold routes that are never limited: say so, without refusing.
        for unmatched in limiter.reloader().rules().unmatched_route_keys() {
            tracing::warn!("{unmatched}");
        }
        let layer = SharedLimitLayer::new(limiter.clone())
            .max_delayed(options.max_delayed)
            .trust_proxies(options.trusted_proxies.iter().copied())
            .client_ip_header(options.client_ip_header);
        // A service per connection, which knows its peer: the requests carry no `PeerAddr`.
        let metered = metered::Metered::new(layer, forward);
        let bound = sluice_http::lifecycle::bind(options.listen).await?;
        let addr = lifecycle.serve_with(
            bound,
            move |peer| metered.for_peer(peer),
            sluice_http::h1_server::Fields::All,
        );
        lifecycle.sample(&limiter);
        let admin_addr = match options.admin_addr {
            Some(at) => {
                let state = AdminState {
                    limiter: limiter.clone(),
                    admin_token: options.admin_token.as_deref().map(Arc::from),
                };
                Some(lifecycle.serve_admin(at, state).await?)
            }
            None => None,
        };
        tracing::info!(%addr, admin = ?admin_addr, upstream = %options.upstream, "sluice proxy is forwarding");
        Ok(Gateway {
            addr,
            admin_addr,
            limiter,
            lifecycle,
        })
    }

    /// Where the gateway listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the admin listener listens, if there is one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The limiter the gateway decides with.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// Stops accepting, lets requests in flight finish, and returns when every connection has
    /// closed.
    pub async fn shutdown(self) {
        self.lifecycle.shutdown().await;
    }
}

/// A running gateway is stopped through its lifecycle: how [`lifecycle::run`] stops it.
impl From<Gateway> for Lifecycle {
    fn from(gateway: Gateway) -> Self {
        gateway.lifecycle
    }
}
