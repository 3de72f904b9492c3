//! `sluice`: the rate-limit service, the gateway, a rule validator and a load generator, each a
//! thin wrapper around its library crate.

mod args;
mod bench_cmd;
mod envoy_env;
mod simulate_cmd;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use sluice_gateway::{Gateway, GatewayOptions};
use sluice_rules::{LoadOptions, RuleSet};
use sluice_server::{ServeOptions, Server};

use crate::args::{
    ConnectionArgs, Headers, LogArgs, LogFormat, RulesArgs, StoreArgs, raise_open_files_limit,
    run_until_stopped, start_runtime, start_runtime_logging,
};

/// The binary allocates per request on every path (headers, JSON, protobuf, keys); mimalloc's
/// thread-local free lists serve that pattern faster than the system allocator. The library
/// crates leave the choice to whoever embeds them.
#[global_allocator]
static ALLOCATOR: sluice_alloc::Allocator = sluice_alloc::Allocator;

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
    /// Generate load against the service, a gateway or any HTTP endpoint, and report
    /// throughput and latency percentiles.
    Bench {
        #[command(subcommand)]
        target: bench_cmd::BenchTarget,
    },
    /// Run the real algorithms on a simulated clock against a traffic trace and write an HTML
    /// report with plots and a CSV of every decision.
    Simulate(simulate_cmd::SimulateArgs),
    /// Check rule files and directories; prints every error as file:line:col.
    Validate {
        /// Files or directories of rules.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Also refuse limits this store cannot hold, as `serve --store` would at start (a
        /// Redis store is not contacted: only its URL is read).
        #[arg(long)]
        store: Option<String>,
        /// Several files of one domain add their descriptors to it, as `serve
        /// --merge-domains` reads them.
        #[arg(long)]
        merge_domains: bool,
    },
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
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
}

#[derive(Debug, clap::Args)]
struct ProxyArgs {
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

fn main() -> ExitCode {
    let mut argv = std::env::args_os();
    let name = argv
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let rest: Vec<_> = argv.collect();
    if name.as_deref() == Some("ratelimit")
        || (rest.len() == 2 && rest[0] == "serve" && rest[1] == "--envoy-env")
    {
        return exit(serve_envoy_env());
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Validate {
            paths,
            store,
            merge_domains,
        } => validate(&paths, store.as_deref(), LoadOptions { merge_domains }),
        Command::Serve(args) => exit(serve(args)),
        Command::Proxy(args) => exit(proxy(args)),
        Command::Bench { target } => exit(bench_cmd::run(target)),
        Command::Simulate(args) => exit(simulate_cmd::run(args)),
    }
}

fn exit(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: {}", report(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, each cause once: errors that already quote their cause
/// in their own message (`cannot listen on ADDR: REASON`) do not get it repeated after them.
fn report(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.is_empty() {
            line = text;
        } else if !line.contains(&text) {
            line = format!("{line}: {text}");
        }
    }
    line
}

/// Serves with envoyproxy/ratelimit's environment variables as the only settings.
fn serve_envoy_env() -> anyhow::Result<()> {
    let vars: BTreeMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let launch = envoy_env::launch(&vars).map_err(anyhow::Error::msg)?;
    let format = if launch.log_json {
        LogFormat::Json
    } else {
        LogFormat::Pretty
    };
    let runtime = start_runtime_logging(format, launch.log_filter)?;
    if !launch.not_honoured.is_empty() {
        tracing::warn!(
            "environment variables not honoured: {}",
            launch.not_honoured.join("; ")
        );
    }
    if !launch.not_needed.is_empty() {
        tracing::info!(
            "environment variables with nothing to do (one multiplexed connection per Redis node): {}",
            launch.not_needed.join(", ")
        );
    }
    let open_files = raise_open_files_limit();
    let connections = ConnectionArgs::defaults();
    let deadline = connections.shutdown_timeout;
    let mut options = launch.options;
    options.connections = connections.limits(open_files);
    let start = async move {
        let server = Server::start(options).await?;
        shutdown_signal().await;
        Ok(server)
    };
    run_until_stopped(runtime, deadline, start, |server| {
        Box::pin(server.shutdown())
    })
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    if args.envoy_env {
        anyhow::bail!("--envoy-env takes every setting from the environment: give it alone");
    }
    let runtime = start_runtime(&args.log)?;
    let open_files = raise_open_files_limit();
    let deadline = args.connections.shutdown_timeout;
    let start = async move {
        let mut options = ServeOptions::new(args.rules.config);
        options.connections = args.connections.limits(open_files);
        options.reload_debounce = args.rules.reload_debounce;
        options.load.merge_domains = args.merge_domains;
        options.store_settings = args.store.settings();
        options.store = args.store.store;
        options.http_addr = args.http_addr;
        options.grpc_addr = args.grpc_addr;
        options.admin_token = args.admin_token;
        options.http_headers = args.http_headers.into();
        options.grpc_headers = args.grpc_headers.into();
        let server = Server::start(options).await?;
        shutdown_signal().await;
        Ok(server)
    };
    run_until_stopped(runtime, deadline, start, |server| {
        Box::pin(server.shutdown())
    })
}

fn proxy(args: ProxyArgs) -> anyhow::Result<()> {
    let runtime = start_runtime(&args.log)?;
    let open_files = raise_open_files_limit();
    let deadline = args.connections.shutdown_timeout;
    let start = async move {
        let mut options = GatewayOptions::new(args.rules.config, args.upstream);
        options.connections = args.connections.limits(open_files);
        options.reload_debounce = args.rules.reload_debounce;
        options.store_settings = args.store.settings();
        options.store = args.store.store;
        options.listen = args.listen;
        options.admin_addr = args.admin_addr;
        options.admin_token = args.admin_token;
        options.upstream_timeout = Duration::from_millis(args.upstream_timeout_ms);
        options.connect_timeout = Duration::from_millis(args.connect_timeout_ms);
        options.upstream_h2 = args.upstream_h2;
        options.max_delayed = args.max_delayed;
        options.trusted_proxies = args.trusted_proxies;
        options.client_ip_header = args.client_ip_header;
        let gateway = Gateway::start(options).await?;
        shutdown_signal().await;
        Ok(gateway)
    };
    run_until_stopped(runtime, deadline, start, |gateway| {
        Box::pin(gateway.shutdown())
    })
}

fn validate(paths: &[PathBuf], store: Option<&str>, load: LoadOptions) -> ExitCode {
    let check = match store.map(sluice_stores::supports_check_for).transpose() {
        Ok(check) => check,
        Err(e) => {
            eprintln!("sluice: {e}");
            return ExitCode::FAILURE;
        }
    };
    let loaded = RuleSet::load_all_with(paths, load).and_then(|rules| {
        check.as_ref().map_or(Ok(()), |check| check(&rules))?;
        Ok(rules)
    });
    match loaded {
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

#[cfg(test)]
mod tests {
    use super::report;

    #[test]
    fn a_report_names_each_cause_once() {
        let io = || std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let quoting = sluice_server::StartError::Bind {
            addr: "127.0.0.1:9".parse().unwrap(),
            source: io(),
        };
        let line = report(&anyhow::Error::new(quoting).context("starting the service"));
        assert_eq!(
            line,
            format!(
                "starting the service: cannot listen on 127.0.0.1:9: {}",
                io()
            )
        );
        let plain = anyhow::Error::new(io()).context("reading the rules");
        assert_eq!(report(&plain), format!("reading the rules: {}", io()));
    }
}
