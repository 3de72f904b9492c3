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
//!
//! Its listeners live and stop through `sluice_http::lifecycle`, as the gateway's do. Run as
//! envoyproxy/ratelimit, the service takes that one's environment variables instead of
//! options: [`envoy_env`] turns them into [`ServeOptions`].

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod api;
mod body_deadline;
pub mod compat;
pub mod debug;
pub mod envoy;
pub mod envoy_env;
pub mod envoy_stats;
pub mod grpc;
mod grpc_tls;
mod grpc_workers;
pub mod metadata;
pub mod reservations;
pub mod sluice_v1;
mod unary;
pub mod wire_bounds;
pub mod xds;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use grpc_tls::GrpcTls;
use sluice_http::admin::AdminState;
use sluice_http::h1_server::Fields;
use sluice_http::lifecycle::{self, BindError, Bound, Lifecycle};
pub use sluice_http::serve::ConnectionLimits;
use sluice_limiter::{HeaderStyle, Limiter, OpenStore};
use sluice_stores::StoreSettings;

/// How to run the service.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Rule files or directories.
    pub config: Vec<PathBuf>,
    /// How the rule files (or the xDS resources) are read into one set: whether several of
    /// one domain merge.
    pub load: sluice_rules::LoadOptions,
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
    /// How long clients may take to send a request head (on every listener, from connecting),
    /// how long a connection may stay idle, how idle h2 connections (HTTP and gRPC) are
    /// pinged, and how many connections are held.
    pub connections: ConnectionLimits,
    /// Service-wide settings of the Envoy answers (global shadow mode, rate-limit headers).
    pub envoy: compat::EnvoyAnswers,
    /// Where the debug listener serves `/rlconfig` and the admin endpoints (none unless given).
    pub debug_addr: Option<SocketAddr>,
    /// Where a listener serves only the metrics, at `metrics_path` (none unless given).
    pub metrics_addr: Option<SocketAddr>,
    /// The path of the metrics on `metrics_addr`.
    pub metrics_path: String,
    /// TLS on the gRPC listener, mutual when it names the clients' CA.
    pub grpc_tls: Option<GrpcTls>,
    /// Rules from an xDS server instead of `config`'s files.
    pub xds: Option<xds::XdsOptions>,
    /// How long `/v1/reserve` reservations hold: by default, and at most.
    pub reservations: sluice_limiter::ReservationTtls,
    /// envoyproxy/ratelimit's statistics under its names, to statsd and on the metrics
    /// listener (none unless given).
    pub envoy_stats: Option<envoy_stats::EnvoyStatsOptions>,
}

impl ServeOptions {
    /// Defaults, on loopback ports 8080 (HTTP) and 8081 (gRPC), with the memory store.
    pub fn new(config: Vec<PathBuf>) -> Self {
        ServeOptions {
            config,
            load: sluice_rules::LoadOptions::default(),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 8081)),
            store: "memory".to_owned(),
            admin_token: None,
            http_headers: HeaderStyle::Ietf,
            grpc_headers: HeaderStyle::None,
            reload_debounce: Duration::from_millis(250),
            store_settings: StoreSettings::default(),
            connections: ConnectionLimits::default(),
            envoy: compat::EnvoyAnswers::default(),
            debug_addr: None,
            metrics_addr: None,
            metrics_path: "/metrics".to_owned(),
            grpc_tls: None,
            xds: None,
            reservations: sluice_limiter::ReservationTtls::default(),
            envoy_stats: None,
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
    /// The gRPC listener's TLS settings were refused.
    #[error("gRPC TLS: {0}")]
    Tls(String),
}

impl From<BindError> for StartError {
    fn from(e: BindError) -> Self {
        StartError::Bind {
            addr: e.addr,
            source: e.source,
        }
    }
}

/// A running service.
#[derive(Debug)]
pub struct Server {
    http_addr: SocketAddr,
    grpc_addr: SocketAddr,
    limiter: Arc<Limiter>,
    /// Its listeners and tasks, and the rule files' watcher when the rules come from files.
    lifecycle: Lifecycle,
}

impl Server {
    /// Opens the store, loads the rules (refusing any the store cannot hold, then and on every
    /// reload), binds both listeners and starts serving.
    pub async fn start(options: ServeOptions) -> Result<Server, StartError> {
        let store = sluice_stores::open(&options.store, &options.store_settings)
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
        let mut lifecycle = Lifecycle::new(options.connections);
        let limiter = follow_rules(&options, opened, &mut lifecycle).await?;
        // Rules that load can still hold routes that are never limited: say so, without refusing.
        for unmatched in limiter.reloader().rules().unmatched_route_keys() {
            tracing::warn!("{unmatched}");
        }
        // The shared overrides are read before anything answers, so a restarted instance
        // enforces them from its first request.
        lifecycle.follow_overrides(&limiter).await;
        // The two ports every service has, bound before anything answers on either.
        let http = lifecycle::bind(options.http_addr).await?;
        let grpc = lifecycle::bind(options.grpc_addr).await?;
        limiter.set_quota_mode(options.envoy.quota_mode);
        limiter.set_reservation_ttls(options.reservations);
        let admin = AdminState {
            limiter: limiter.clone(),
            admin_token: options.admin_token.as_deref().map(Arc::from),
        };
        let stats = envoy_stats(&options, &limiter, &mut lifecycle);
        let api = http_api(&options, &admin, stats.clone());
        let http_addr = lifecycle.serve_with(
            http,
            move |peer| api.for_peer(peer),
            Fields::UnreadFor(api::ApiService::reads_body_only),
        );
        serve_debug(&options, &admin, &mut lifecycle).await?;
        serve_metrics(&options, &admin, stats.clone(), &mut lifecycle).await?;
        let grpc_addr = serve_grpc(&options, &limiter, stats, grpc, &mut lifecycle).await?;
        lifecycle.sample(&limiter);
        tracing::info!(%http_addr, %grpc_addr, store = %options.store, tls = options.grpc_tls.is_some(), "sluice is serving");
        Ok(Server {
            http_addr,
            grpc_addr,
            limiter,
            lifecycle,
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
        self.lifecycle.shutdown().await;
    }
}

/// A running service is stopped through its lifecycle: how [`lifecycle::run`] stops it.
impl From<Server> for Lifecycle {
    fn from(server: Server) -> Self {
        server.lifecycle
    }
}

/// The limiter over the rules: from the files, followed as they change, or from the xDS
/// server, waiting for its first rules when `wait_for_rules` says so (the listeners are bound
/// only then, so that no one is answered without rules).
async fn follow_rules(
    options: &ServeOptions,
    opened: OpenStore,
    lifecycle: &mut Lifecycle,
) -> Result<Arc<Limiter>, StartError> {
    let Some(xds) = &options.xds else {
        return Ok(lifecycle.follow_files(
            options.config.clone(),
            options.load,
            opened,
            options.reload_debounce,
        )?);
    };
    let (limiter, reloader) = Lifecycle::follow_pushed(options.load, opened);
    let first = xds.wait_for_rules.then(|| reloader.subscribe());
    lifecycle.spawn(xds::follow(xds.clone(), reloader, lifecycle.stopped()));
    if let Some(events) = first {
        tracing::info!("waiting for the first rules from the xDS server");
        wait_for_rules(events).await;
    }
    Ok(limiter)
}

/// envoyproxy/ratelimit's statistics, when `envoy_stats` asks for them, with their statsd
/// sender started.
fn envoy_stats(
    options: &ServeOptions,
    limiter: &Arc<Limiter>,
    lifecycle: &mut Lifecycle,
) -> Option<Arc<envoy_stats::EnvoyStats>> {
    let settings = options.envoy_stats.as_ref()?;
    let stats = Arc::new(envoy_stats::EnvoyStats::new(
        settings,
        limiter.reloader().clone(),
        options.xds.is_none(),
    ));
    if let Some(target) = &settings.statsd {
        tracing::info!(
            statsd = %format!("{}:{}", target.host, target.port),
            every = ?settings.flush_interval,
            "sending envoyproxy/ratelimit's statistics to statsd"
        );
        lifecycle.spawn(envoy_stats::send_every(
            stats.clone(),
            target.clone(),
            settings.flush_interval,
            lifecycle.stopped(),
        ));
    }
    Some(stats)
}

/// The HTTP API: `/json`, `/v1/check` and the admin endpoints.
fn http_api(
    options: &ServeOptions,
    admin: &AdminState,
    envoy_stats: Option<Arc<envoy_stats::EnvoyStats>>,
) -> api::ApiService {
    api::ApiService::new(api::ApiState {
        limiter: admin.limiter.clone(),
        admin_token: admin.admin_token.clone(),
        headers: options.http_headers,
        envoy: options.envoy.clone(),
        envoy_stats,
    })
}

/// The debug listener envoyproxy/ratelimit's users know, when `debug_addr` asks for one.
async fn serve_debug(
    options: &ServeOptions,
    admin: &AdminState,
    lifecycle: &mut Lifecycle,
) -> Result<(), BindError> {
    if let Some(addr) = options.debug_addr {
        let addr = lifecycle.listen(addr, debug::router(admin.clone())).await?;
        tracing::info!(%addr, "debug listener: /rlconfig and the admin endpoints");
    }
    Ok(())
}

/// A listener of the metrics alone at `metrics_path`, when `metrics_addr` asks for one; with
/// envoyproxy/ratelimit's statistics after Sluice's own when they are kept for Prometheus.
async fn serve_metrics(
    options: &ServeOptions,
    admin: &AdminState,
    envoy_stats: Option<Arc<envoy_stats::EnvoyStats>>,
    lifecycle: &mut Lifecycle,
) -> Result<(), BindError> {
    if let Some(addr) = options.metrics_addr {
        let path = if options.metrics_path.starts_with('/') {
            options.metrics_path.clone()
        } else {
            format!("/{}", options.metrics_path)
        };
        let for_prometheus = options.envoy_stats.as_ref().is_some_and(|s| s.prometheus);
        let metrics = match envoy_stats.filter(|_| for_prometheus) {
            Some(stats) => axum::Router::new().route(
                &path,
                axum::routing::get(move |state| with_envoy_stats(state, stats.clone())),
            ),
            None => {
                axum::Router::new().route(&path, axum::routing::get(sluice_http::admin::metrics))
            }
        }
        .with_state(admin.clone());
        let addr = lifecycle.listen(addr, metrics).await?;
        tracing::info!(%addr, %path, "metrics listener");
    }
    Ok(())
}

/// The metrics, with envoyproxy/ratelimit's statistics before the OpenMetrics end marker.
async fn with_envoy_stats(
    axum::extract::State(state): axum::extract::State<AdminState>,
    stats: Arc<envoy_stats::EnvoyStats>,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let mut text = state.limiter.render_metrics();
    if text.ends_with("# EOF\n") {
        text.truncate(text.len() - "# EOF\n".len());
    }
    stats.render_prometheus(&mut text);
    text.push_str("# EOF\n");
    (
        [(
            http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// Serves Envoy's `ShouldRateLimit`, `sluice.v1.Reservations` and gRPC health on `grpc`, on
/// runtimes of their own (one per CPU, see [`grpc_workers`]), with TLS when `grpc_tls` asks;
/// returns the address.
async fn serve_grpc(
    options: &ServeOptions,
    limiter: &Arc<Limiter>,
    envoy_stats: Option<Arc<envoy_stats::EnvoyStats>>,
    grpc: Bound,
    lifecycle: &mut Lifecycle,
) -> Result<SocketAddr, StartError> {
    let health_reporter = tonic_health::server::HealthReporter::new();
    let health = tonic_health::pb::health_server::HealthServer::new(
        tonic_health::server::HealthService::from_health_reporter(health_reporter.clone()),
    );
    health_reporter
        .set_serving::<envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer<grpc::RlsService>>()
        .await;
    health_reporter
        .set_serving::<sluice_v1::reservations_server::ReservationsServer<reservations::ReservationsService>>()
        .await;
    let service = grpc::RlsService::new(limiter.clone(), options.grpc_headers)
        .with_answers(options.envoy.clone())
        .with_stats(envoy_stats);
    let rls = service.clone().into_server();
    let tls = options
        .grpc_tls
        .as_ref()
        .map(grpc_tls::acceptor)
        .transpose()
        .map_err(StartError::Tls)?;
    let serving = grpc_workers::Serving {
        routes: grpc_workers::GrpcRoutes {
            service: Arc::new(service),
            rls,
            reservations: reservations::ReservationsService::new(limiter.clone()).into_server(),
            health,
        },
        tls,
        limits: lifecycle.limits(),
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let stopped = lifecycle.stopped();
    lifecycle.spawn(grpc_workers::serve(
        grpc.listener,
        serving,
        threads,
        stopped,
    ));
    Ok(grpc.addr)
}

/// Returns once a rule set is in force (a first set that was refused does not count).
async fn wait_for_rules(events: std::sync::mpsc::Receiver<sluice_rules::ReloadEvent>) {
    let _ = tokio::task::spawn_blocking(move || {
        events
            .iter()
            .find(|e| !matches!(e, sluice_rules::ReloadEvent::Failed(_)))
    })
    .await;
}
