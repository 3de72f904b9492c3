//! `sluice`: the rate-limit service, and a validator for rule files.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use sluice_http::HeaderStyle;
use sluice_rules::RuleSet;
use sluice_server::{ServeOptions, Server};

#[derive(Debug, Parser)]
#[command(
    name = "sluice",
    version,
    about = "A distributed rate limiter for HTTP APIs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the rate-limit service: Envoy's gRPC protocol and an HTTP JSON API.
    Serve(ServeArgs),
    /// Run the gateway: a reverse proxy that limits requests by the rules' routes.
    Proxy(ProxyArgs),
    /// Check rule files and directories; prints every error as file:line:col.
    Validate {
        /// Files or directories of rules.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Pretty,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Headers {
    Ietf,
    Legacy,
    Both,
    None,
}

impl From<Headers> for HeaderStyle {
    fn from(h: Headers) -> Self {
        match h {
            Headers::Ietf => HeaderStyle::Ietf,
            Headers::Legacy => HeaderStyle::Legacy,
            Headers::Both => HeaderStyle::Both,
            Headers::None => HeaderStyle::None,
        }
    }
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Rule file or directory (repeatable).
    #[arg(long, env = "SLUICE_CONFIG", required = true, value_delimiter = ',')]
    config: Vec<PathBuf>,
    /// Where the HTTP API listens.
    #[arg(long, env = "SLUICE_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    http_addr: SocketAddr,
    /// Where the gRPC service listens.
    #[arg(long, env = "SLUICE_GRPC_ADDR", default_value = "127.0.0.1:8081")]
    grpc_addr: SocketAddr,
    /// Where counters live: `memory`, `memory://?max_keys=N`, `redis://[user:pass@]host:port`,
    /// `rediss://…`, `redis+sentinel://host:port,…/master`, or `redis+cluster://host:port,…`.
    #[arg(long, env = "SLUICE_STORE", default_value = "memory")]
    store: String,
    /// The first part of every Redis key, so deployments sharing a Redis stay apart.
    #[arg(long, env = "SLUICE_STORE_PREFIX", default_value = "sluice")]
    store_prefix: String,
    /// Milliseconds one store call may take before the rule's on_store_error applies.
    #[arg(long, env = "SLUICE_STORE_TIMEOUT_MS", default_value_t = 50)]
    store_timeout_ms: u64,
    /// Bearer token that opens the admin endpoints to non-loopback clients.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN")]
    admin_token: Option<String>,
    /// Log format.
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value = "pretty")]
    log_format: LogFormat,
    /// Rate-limit headers on HTTP API answers.
    #[arg(long, env = "SLUICE_HTTP_HEADERS", value_enum, default_value = "ietf")]
    http_headers: Headers,
    /// Rate-limit headers Envoy is asked to add to its responses.
    #[arg(long, env = "SLUICE_GRPC_HEADERS", value_enum, default_value = "none")]
    grpc_headers: Headers,
    /// Milliseconds the rule files must be quiet before a change is reloaded.
    #[arg(long, env = "SLUICE_RELOAD_DEBOUNCE_MS", default_value_t = 250)]
    reload_debounce_ms: u64,
}

#[derive(Debug, clap::Args)]
struct ProxyArgs {
    /// Rule file or directory (repeatable); one file holds the `routes`.
    #[arg(long, env = "SLUICE_CONFIG", required = true, value_delimiter = ',')]
    config: Vec<PathBuf>,
    /// Where the gateway listens.
    #[arg(long, env = "SLUICE_LISTEN", default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// The API behind the gateway, as http://host:port.
    #[arg(long, env = "SLUICE_UPSTREAM")]
    upstream: http::Uri,
    /// Where counters live: `memory` or `memory://?max_keys=N`.
    #[arg(long, env = "SLUICE_STORE", default_value = "memory")]
    store: String,
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
    /// A proxy whose X-Forwarded-For and Forwarded headers are believed, as a CIDR
    /// (repeatable), beyond the rules' `trusted_proxies`.
    #[arg(
        long = "trusted-proxy",
        env = "SLUICE_TRUSTED_PROXIES",
        value_delimiter = ','
    )]
    trusted_proxies: Vec<sluice_rules::Cidr>,
    /// Log format.
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value = "pretty")]
    log_format: LogFormat,
    /// Milliseconds the rule files must be quiet before a change is reloaded.
    #[arg(long, env = "SLUICE_RELOAD_DEBOUNCE_MS", default_value_t = 250)]
    reload_debounce_ms: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Validate { paths } => validate(&paths),
        Command::Serve(args) => exit(serve(args)),
        Command::Proxy(args) => exit(proxy(args)),
    }
}

fn exit(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn proxy(args: ProxyArgs) -> anyhow::Result<()> {
    let runtime = start_runtime(args.log_format)?;
    runtime.block_on(async move {
        let rules = sluice_rules::Reloader::new(args.config)
            .map_err(|e| anyhow::anyhow!("invalid rules:\n{e}"))?;
        if rules.rules().gateway().is_none_or(|g| g.routes.is_empty()) {
            tracing::warn!("the rules have no `routes`; every request passes unlimited");
        }
        let _watcher = rules
            .watch(Duration::from_millis(args.reload_debounce_ms))
            .context("cannot watch the rule files for changes")?;
        let store = sluice_server::store_url::open(&args.store, &Default::default())
            .await?
            .store;
        let limiter = std::sync::Arc::new(sluice_http::Limiter::new(
            rules,
            store,
            std::sync::Arc::new(sluice_http::Metrics::new()),
        ));
        let mut options = sluice_http::ProxyOptions::new(args.upstream);
        options.listen = args.listen;
        options.upstream_timeout = Duration::from_millis(args.upstream_timeout_ms);
        options.connect_timeout = Duration::from_millis(args.connect_timeout_ms);
        options.upstream_h2 = args.upstream_h2;
        options.max_delayed = args.max_delayed;
        options.trusted_proxies = args.trusted_proxies;
        let proxy = sluice_http::Proxy::start(options, limiter).await?;
        shutdown_signal().await;
        tracing::info!("shutting down: finishing requests in flight");
        proxy.shutdown().await;
        Ok(())
    })
}

fn validate(paths: &[PathBuf]) -> ExitCode {
    match RuleSet::load_all(paths) {
        Ok(rules) => {
            println!(
                "ok: {} domain(s): {}",
                rules.domain_names().len(),
                rules.domain_names().join(", ")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Pretty => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Starts logging and the async runtime, as every long-running command does.
fn start_runtime(format: LogFormat) -> anyhow::Result<tokio::runtime::Runtime> {
    init_logging(format);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let runtime = start_runtime(args.log_format)?;
    runtime.block_on(async move {
        let mut options = ServeOptions::new(args.config);
        options.http_addr = args.http_addr;
        options.grpc_addr = args.grpc_addr;
        options.store = args.store;
        options.store_settings = sluice_server::store_url::StoreSettings {
            prefix: args.store_prefix,
            timeout: Duration::from_millis(args.store_timeout_ms),
        };
        options.admin_token = args.admin_token;
        options.http_headers = args.http_headers.into();
        options.grpc_headers = args.grpc_headers.into();
        options.reload_debounce = Duration::from_millis(args.reload_debounce_ms);
        let server = Server::start(options).await?;
        shutdown_signal().await;
        tracing::info!("shutting down: finishing requests in flight");
        server.shutdown().await;
        Ok(())
    })
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
