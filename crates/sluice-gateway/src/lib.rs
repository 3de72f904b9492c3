//! `sluice proxy`: a reverse proxy that limits requests by the rules' `routes` before they reach
//! the upstream, so the API behind it needs no change.
//!
//! It is the tower [`SharedLimitLayer`] around a forwarding service: the gateway and the
//! middleware answer alike because they are the same code. Bodies are streamed both ways,
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

mod forward;
mod upstream_pool;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use sluice_http::admin::{self, AdminState};
pub use sluice_http::client_ip::ForwardedHeader;
pub use sluice_http::serve::ConnectionLimits;
use sluice_http::serve::serve_connections;
use sluice_http::{DEFAULT_MAX_DELAYED, SharedLimitLayer};
use sluice_limiter::{Limiter, StartError};
use sluice_rules::{Cidr, Watcher};
use sluice_stores::StoreSettings;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower_layer::Layer;

pub use forward::GatewayBody;
pub use upstream_pool::UpstreamBody;

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

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    limiter: Arc<Limiter>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    _watcher: Option<Watcher>,
}

impl Gateway {
    /// Opens the store, loads the rules (refusing any the store cannot hold, then and on every
    /// reload, each reload logged), binds the proxy and admin listeners and starts forwarding.
    pub async fn start(options: GatewayOptions) -> Result<Gateway, GatewayError> {
        let opened = sluice_stores::open(&options.store, &options.store_settings)
            .await
            .map_err(StartError::from)?;
        let watched = Limiter::watching(
            options.config.clone(),
            sluice_rules::LoadOptions::default(),
            opened,
            options.reload_debounce,
        )?;
        if watched
            .limiter
            .reloader()
            .rules()
            .gateway()
            .is_none_or(|g| g.routes.is_empty())
        {
            tracing::warn!("the rules have no `routes`; every request passes unlimited");
        }
        let mut gateway = Self::start_with_limiter(options, watched.limiter).await?;
        gateway._watcher = Some(watched.watcher);
        Ok(gateway)
    }

    /// Starts forwarding with a limiter built by the caller, ignoring `options.config` and
    /// `options.store`: how tests run the gateway on a store with a fake clock, and how an
    /// embedder shares one limiter.
    pub async fn start_with_limiter(
        options: GatewayOptions,
        limiter: Arc<Limiter>,
    ) -> Result<Gateway, GatewayError> {
        let forward = forward::Forward::new(&options)?;
        let layer = SharedLimitLayer::new(limiter.clone())
            .max_delayed(options.max_delayed)
            .trust_proxies(options.trusted_proxies.iter().copied())
            .client_ip_header(options.client_ip_header);
        let service = layer.layer(forward);
        let listener = bind(options.listen).await?;
        let addr = listener.local_addr().unwrap_or(options.listen);
        let (stop, stopped) = watch::channel(false);
        let mut tasks = vec![tokio::spawn(serve_connections(
            listener,
            service,
            stopped.clone(),
            options.connections,
        ))];
        // The dashboard's history, served on the admin listener.
        tasks.push(sluice_limiter::activity::sample_every(
            &limiter,
            std::time::Duration::from_secs(1),
            stopped.clone(),
        ));
        let mut admin_addr = None;
        if let Some(at) = options.admin_addr {
            let listener = bind(at).await?;
            admin_addr = Some(listener.local_addr().unwrap_or(at));
            let state = AdminState {
                limiter: limiter.clone(),
                admin_token: options.admin_token.as_deref().map(Arc::from),
            };
            tasks.push(tokio::spawn(serve_admin(
                listener,
                state,
                stopped,
                options.connections,
            )));
        }
        tracing::info!(%addr, admin = ?admin_addr, upstream = %options.upstream, "sluice proxy is forwarding");
        Ok(Gateway {
            addr,
            admin_addr,
            limiter,
            stop,
            tasks,
            _watcher: None,
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
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, GatewayError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| GatewayError::Bind { addr, source })
}

/// Serves the admin router until `stopped`.
async fn serve_admin(
    listener: TcpListener,
    state: AdminState,
    stopped: watch::Receiver<bool>,
    limits: ConnectionLimits,
) {
    let app = admin::router(state).fallback(|| async {
        sluice_http::problem::Problem::new(
            http::StatusCode::NOT_FOUND,
            "no such endpoint on the admin listener",
        )
    });
    serve_connections(listener, app, stopped, limits).await;
}
