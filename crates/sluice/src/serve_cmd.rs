//! `sluice serve`: the rate-limit service, from its options, or from envoyproxy/ratelimit's
//! environment variables when the binary runs as that service.

use std::net::SocketAddr;
use std::time::Duration;

use sluice_core::parse_duration_or_error;
use sluice_http::serve::ConnectionLimits;
use sluice_limiter::ReservationTtls;
use sluice_server::{ServeOptions, Server, StartError, envoy_env};

use crate::args::{ConnectionArgs, Headers, LogArgs, LogFormat, RulesArgs, StoreArgs};
use crate::listen_error::Listeners;
use crate::start::run_service;

#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    rules: RulesArgs,
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    log: LogArgs,
    #[command(flatten)]
    connections: ConnectionArgs,
    /// Where the HTTP API listens.
    #[arg(long, env = "SLUICE_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    http_addr: SocketAddr,
    /// Where the gRPC service listens.
    #[arg(long, env = "SLUICE_GRPC_ADDR", default_value = "127.0.0.1:8081")]
    grpc_addr: SocketAddr,
    /// Bearer token that opens the admin endpoints to non-loopback clients.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN")]
    admin_token: Option<String>,
    /// Rate-limit headers on HTTP API answers.
    #[arg(long, env = "SLUICE_HTTP_HEADERS", value_enum, default_value = "ietf")]
    http_headers: Headers,
    /// Rate-limit headers Envoy is asked to add to its responses.
    #[arg(long, env = "SLUICE_GRPC_HEADERS", value_enum, default_value = "none")]
    grpc_headers: Headers,
    /// Take every setting from envoyproxy/ratelimit's environment variables (RUNTIME_ROOT,
    /// REDIS_URL, GRPC_PORT, …), as the binary does when started under the name `ratelimit`;
    /// given alone, with no other option.
    #[arg(long)]
    envoy_env: bool,
    /// Several rule files of one domain add their descriptors to it (envoyproxy/ratelimit's
    /// MERGE_DOMAIN_CONFIG); without it, a domain in a second file is an error.
    #[arg(long, env = "SLUICE_MERGE_DOMAINS")]
    merge_domains: bool,
    /// How long a `/v1/reserve` reservation holds when its request names no `ttl`; not settled
    /// by then, it counts as used in full.
    #[arg(long, env = "SLUICE_RESERVATION_TTL", value_parser = parse_duration_or_error, default_value = "5m")]
    reservation_ttl: Duration,
    /// The longest `ttl` a reservation may ask for.
    #[arg(long, env = "SLUICE_MAX_RESERVATION_TTL", value_parser = parse_duration_or_error, default_value = "1h")]
    max_reservation_ttl: Duration,
}

impl ServeArgs {
    /// The service's options, its connections under `connections`.
    fn options(self, connections: ConnectionLimits) -> ServeOptions {
        let mut options = ServeOptions::new(self.rules.config);
        options.connections = connections;
        options.reload_debounce = self.rules.reload_debounce;
        options.load.merge_domains = self.merge_domains;
        options.store_settings = self.store.settings();
        options.store = self.store.store;
        options.http_addr = self.http_addr;
        options.grpc_addr = self.grpc_addr;
        options.admin_token = self.admin_token;
        options.http_headers = self.http_headers.into();
        options.grpc_headers = self.grpc_headers.into();
        options.reservations = ReservationTtls {
            default: self.reservation_ttl,
            max: self.max_reservation_ttl,
        };
        options
    }
}

/// Serves with the options given.
pub(crate) fn run(args: ServeArgs) -> anyhow::Result<()> {
    if args.envoy_env {
        anyhow::bail!("--envoy-env takes every setting from the environment: give it alone");
    }
    if args.reservation_ttl.is_zero() || args.reservation_ttl > args.max_reservation_ttl {
        anyhow::bail!(
            "--reservation-ttl must be more than 0 and at most --max-reservation-ttl ({:?})",
            args.max_reservation_ttl
        );
    }
    let listeners = Listeners::default()
        .at("--http-addr", args.http_addr)
        .at("--grpc-addr", args.grpc_addr);
    run_service(args.log.log_format, "info", args.connections, |limits| {
        start(args.options(limits), listeners)
    })
}

/// Starts the service; a listener that cannot be bound is named by the setting that chose it.
async fn start(options: ServeOptions, listeners: Listeners) -> anyhow::Result<Server> {
    Server::start(options).await.map_err(|e| match e {
        StartError::Bind { addr, source } => listeners.error(addr, source).into(),
        e => e.into(),
    })
}

/// Serves with envoyproxy/ratelimit's environment variables as the only settings.
pub(crate) fn run_envoy_env() -> anyhow::Result<()> {
    let launch = envoy_env::launch(&envoy_env::process_variables()).map_err(anyhow::Error::msg)?;
    let format = if launch.log_json {
        LogFormat::Json
    } else {
        LogFormat::Pretty
    };
    let filter = launch.log_filter;
    run_service(format, filter, ConnectionArgs::defaults(), |limits| {
        launch.log_unused_variables();
        let mut options = launch.options;
        options.connections = limits;
        let listeners = Listeners::default()
            .at("HOST/PORT", options.http_addr)
            .at("GRPC_HOST/GRPC_PORT", options.grpc_addr)
            .maybe_at("DEBUG_HOST/DEBUG_PORT", options.debug_addr)
            .maybe_at("PROMETHEUS_ADDR", options.metrics_addr);
        start(options, listeners)
    })
}
