//! `sluice proxy`: the gateway, a reverse proxy that limits requests by the rules' routes.

use std::net::SocketAddr;
use std::time::Duration;

use sluice_gateway::{Gateway, GatewayError, GatewayOptions};
use sluice_http::serve::ConnectionLimits;

use crate::args::{ConnectionArgs, LogArgs, RulesArgs, StoreArgs};
use crate::listen_error::Listeners;
use crate::start::run_service;

#[derive(Debug, clap::Args)]
pub(crate) struct ProxyArgs {
    #[command(flatten)]
    rules: RulesArgs,
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    log: LogArgs,
    #[command(flatten)]
    connections: ConnectionArgs,
    /// Where the gateway listens.
    #[arg(long, env = "SLUICE_LISTEN", default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// Where `/metrics`, `/healthz`, `/readyz` and the admin endpoints listen (none unless
    /// given).
    #[arg(long, env = "SLUICE_ADMIN_ADDR")]
    admin_addr: Option<SocketAddr>,
    /// Bearer token that opens the admin endpoints to non-loopback clients.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN")]
    admin_token: Option<String>,
    /// The API behind the gateway, as http://host:port.
    #[arg(long, env = "SLUICE_UPSTREAM")]
    upstream: http::Uri,
    /// Milliseconds the upstream may take to start answering before the client gets 504.
    #[arg(long, env = "SLUICE_UPSTREAM_TIMEOUT_MS", default_value_t = 30_000)]
    upstream_timeout_ms: u64,
    /// Milliseconds connecting to the upstream may take before the client gets 502.
    #[arg(long, env = "SLUICE_CONNECT_TIMEOUT_MS", default_value_t = 5_000)]
    connect_timeout_ms: u64,
    /// Speak h2 (prior knowledge) to the upstream.
    #[arg(long, env = "SLUICE_UPSTREAM_H2")]
    upstream_h2: bool,
    /// The most requests waiting in `delay` at once; more are rejected.
    #[arg(long, env = "SLUICE_MAX_DELAYED", default_value_t = sluice_http::DEFAULT_MAX_DELAYED)]
    max_delayed: usize,
    /// A proxy whose forwarding header is believed, as a CIDR (repeatable), beyond the rules'
    /// `trusted_proxies`.
    #[arg(
        long = "trusted-proxy",
        env = "SLUICE_TRUSTED_PROXIES",
        value_delimiter = ','
    )]
    trusted_proxies: Vec<sluice_rules::Cidr>,
    /// The forwarding header the trusted proxies write, and the only one read for the client's
    /// address: x-forwarded-for (nginx, HAProxy, Envoy, cloud load balancers) or forwarded.
    #[arg(
        long,
        env = "SLUICE_CLIENT_IP_HEADER",
        default_value = "x-forwarded-for"
    )]
    client_ip_header: sluice_gateway::ForwardedHeader,
}

impl ProxyArgs {
    /// The gateway's options, its connections under `connections`.
    fn options(self, connections: ConnectionLimits) -> GatewayOptions {
        let mut options = GatewayOptions::new(self.rules.config, self.upstream);
        options.connections = connections;
        options.reload_debounce = self.rules.reload_debounce;
        options.store_settings = self.store.settings();
        options.store = self.store.store;
        options.listen = self.listen;
        options.admin_addr = self.admin_addr;
        options.admin_token = self.admin_token;
        options.upstream_timeout = Duration::from_millis(self.upstream_timeout_ms);
        options.connect_timeout = Duration::from_millis(self.connect_timeout_ms);
        options.upstream_h2 = self.upstream_h2;
        options.max_delayed = self.max_delayed;
        options.trusted_proxies = self.trusted_proxies;
        options.client_ip_header = self.client_ip_header;
        options
    }
}

/// Forwards with the options given.
pub(crate) fn run(args: ProxyArgs) -> anyhow::Result<()> {
    let listeners = Listeners::default()
        .at("--listen", args.listen)
        .maybe_at("--admin-addr", args.admin_addr);
    run_service(args.log.log_format, "info", args.connections, |limits| {
        start(args.options(limits), listeners)
    })
}

/// Starts the gateway; a listener that cannot be bound is named by the flag that chose it.
async fn start(options: GatewayOptions, listeners: Listeners) -> anyhow::Result<Gateway> {
    Gateway::start(options).await.map_err(|e| match e {
        GatewayError::Bind { addr, source } => listeners.error(addr, source).into(),
        e => e.into(),
    })
}
