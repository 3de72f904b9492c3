//! The Sluice service: Envoy's rate-limit gRPC protocol, an HTTP JSON API, metrics and admin,
//! over one [`Limiter`].
//!
//! The binary (`sluice serve`) is a thin wrapper around [`Server::start`], which tests call too:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use sluice_server::{ServeOptions, Server};
//! let options = ServeOptions::new(vec!["examples/rules.yaml".into()]);
//! let server = Server::start(options).await?;
//! println!("HTTP on {}, gRPC on {}", server.http_addr(), server.grpc_addr());
//! server.shutdown().await;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod api;
pub mod envoy;
pub mod grpc;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use sluice_http::serve::ConnectionLimits;
use sluice_limiter::{HeaderStyle, Limiter, OpenStore, StoreSettings, store_url};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How to run the service.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Rule files or directories.
    pub config: Vec<PathBuf>,
    /// Where the HTTP API listens.
    pub http_addr: SocketAddr,
    /// Where the gRPC service listens.
    pub grpc_addr: SocketAddr,
    /// The store URL: `memory`, or what later stores accept.
    pub store: String,
    /// The bearer token that opens the admin endpoints to non-loopback peers.
    pub admin_token: Option<String>,
    /// Rate-limit headers on `/v1/check` answers.
    pub http_headers: HeaderStyle,
    /// Rate-limit headers Envoy is asked to add (`response_headers_to_add`).
    pub grpc_headers: HeaderStyle,
    /// How long rule files must be quiet before a change is reloaded.
    pub reload_debounce: Duration,
    /// Key prefix and call timeout for a Redis store.
    pub store_settings: StoreSettings,
    /// How long HTTP clients may take to send a request head, and how idle h2 connections
    /// (HTTP and gRPC) are checked.
    pub connections: ConnectionLimits,
}

impl ServeOptions {
    /// Defaults, on loopback ports 8080 (HTTP) and 8081 (gRPC), with the memory store.
    pub fn new(config: Vec<PathBuf>) -> Self {
        ServeOptions {
            config,
            http_addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 8081)),
            store: "memory".to_owned(),
            admin_token: None,
            http_headers: HeaderStyle::Ietf,
            grpc_headers: HeaderStyle::None,
            reload_debounce: Duration::from_millis(250),
            store_settings: StoreSettings::default(),
            connections: ConnectionLimits::default(),
        }
    }
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The rules or the store could not be loaded.
    #[error(transparent)]
    Limiter(#[from] sluice_limiter::StartError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// A running service.
#[derive(Debug)]
pub struct Server {
    http_addr: SocketAddr,
    grpc_addr: SocketAddr,
    limiter: Arc<Limiter>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    _watcher: sluice_rules::Watcher,
}

impl Server {
    /// Opens the store, loads the rules (refusing any the store cannot hold, then and on every
    /// reload), binds both listeners and starts serving.
    pub async fn start(options: ServeOptions) -> Result<Server, StartError> {
        let store = store_url::open(&options.store, &options.store_settings)
            .await
            .map_err(sluice_limiter::StartError::from)?;
        Self::start_with_open_store(options, store).await
    }

    /// Starts serving on a store built by the caller, ignoring `options.store`: how tests run
    /// the service on a store with a fake clock, and how an embedder shares one store.
    pub async fn start_with_store(
        options: ServeOptions,
        store: Arc<dyn sluice_core::DynStore>,
    ) -> Result<Server, StartError> {
        Self::start_with_open_store(options, OpenStore::plain(store)).await
    }

    async fn start_with_open_store(
        options: ServeOptions,
        opened: OpenStore,
    ) -> Result<Server, StartError> {
        let watched = Limiter::watching(options.config.clone(), opened, options.reload_debounce)?;
        let (limiter, watcher) = (watched.limiter, watched.watcher);
        let bind = |addr: SocketAddr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::Bind { addr, source })
        };
        let http = bind(options.http_addr).await?;
        let grpc = bind(options.grpc_addr).await?;
        let (http_addr, grpc_addr) = (
            local(&http, options.http_addr),
            local(&grpc, options.grpc_addr),
        );
        let (stop, stopped) = watch::channel(false);

        let state = api::ApiState {
            limiter: limiter.clone(),
            admin_token: options.admin_token.map(Arc::from),
            headers: options.http_headers,
        };
        let app = api::router(state);
        let http_task = tokio::spawn(sluice_http::serve::serve_connections(
            http,
            app,
            stopped.clone(),
            options.connections,
        ));

        let (health_reporter, health) = tonic_health::server::health_reporter();
        health_reporter
            .set_serving::<envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer<grpc::RlsService>>()
            .await;
        let rls = grpc::RlsService::new(limiter.clone(), options.grpc_headers).into_server();
        let mut grpc_stop = stopped.clone();
        let limits = options.connections;
        let grpc_task = tokio::spawn(async move {
            let incoming = tokio_stream_listener(grpc);
            let shutdown = async move {
                let _ = grpc_stop.wait_for(|s| *s).await;
            };
            // An h2 client that stops answering pings is dropped.
            let served = tonic::transport::Server::builder()
                .http2_keepalive_interval(Some(limits.h2_keep_alive))
                .http2_keepalive_timeout(Some(limits.h2_keep_alive))
                .add_service(health)
                .add_service(rls)
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "gRPC server failed");
            }
        });
        let sampler = sluice_limiter::activity::sample_every(
            &limiter,
            std::time::Duration::from_secs(1),
            stopped.clone(),
        );
        tracing::info!(%http_addr, %grpc_addr, store = %options.store, "sluice is serving");
        Ok(Server {
            http_addr,
            grpc_addr,
            limiter,
            stop,
            tasks: vec![http_task, grpc_task, sampler],
            _watcher: watcher,
        })
    }

    /// Where the HTTP API listens.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Where the gRPC service listens.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The limiter the service decides with.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// Stops accepting connections, lets requests in flight finish, and returns when both
    /// servers have stopped.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

fn local(listener: &TcpListener, fallback: SocketAddr) -> SocketAddr {
    listener.local_addr().unwrap_or(fallback)
}

/// Accepted connections from `listener`, as tonic's `serve_with_incoming` takes them.
fn tokio_stream_listener(listener: TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}
