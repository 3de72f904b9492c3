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

/// The binary allocates per request on every path (headers, JSON, protobuf, keys); mimalloc's
/// thread-local free lists serve that pattern faster than the system allocator. The library
/// crates leave the choice to whoever embeds them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
        target: BenchTarget,
    },
    /// Check rule files and directories; prints every error as file:line:col.
    Validate {
        /// Files or directories of rules.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Also refuse limits this store cannot hold, as `serve --store` would at start (a
        /// Redis store is not contacted: only its URL is read).
        #[arg(long)]
        store: Option<String>,
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

#[derive(Debug, Subcommand)]
enum BenchTarget {
    /// Load an HTTP endpoint: `/json`, `/v1/check`, a gateway, or the API behind it.
    Http(BenchHttpArgs),
    /// Load Envoy's rate-limit gRPC service (`ShouldRateLimit`).
    Grpc(BenchGrpcArgs),
    /// Serve a trivial `200 ok` to everything: the baseline other runs are compared with.
    Upstream {
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:3000")]
        listen: SocketAddr,
    },
}

/// `{n}`, as the help shows it. clap turns a literal `{n}` in help text into a line break, so an
/// invisible word joiner (U+2060) sits between the brace and the `n`; the bench templates accept
/// that form too, so a placeholder copied from the help works.
macro_rules! key_placeholder {
    () => {
        "`{\u{2060}n}`"
    };
}

#[derive(Debug, clap::Args)]
struct BenchHttpArgs {
    #[arg(help = concat!("The URL, `http://host:port/path?query`; ", key_placeholder!(), " becomes the key number"))]
    url: String,
    /// The request method.
    #[arg(long, short = 'X', default_value = "GET")]
    method: http::Method,
    #[arg(long = "header", short = 'H', help = concat!("A request header, `name: value` (repeatable); ", key_placeholder!(), " becomes the key number"))]
    headers: Vec<String>,
    #[arg(long, short = 'd', help = concat!("A request body (JSON unless a content-type header says otherwise); ", key_placeholder!(), " becomes the key number"))]
    body: Option<String>,
    /// Speak h2 with prior knowledge, the workers multiplexed over `--connections`.
    #[arg(long)]
    h2: bool,
    /// h2 connections the workers share (HTTP/1.1 opens one per worker).
    #[arg(long, default_value_t = 2)]
    connections: usize,
    #[command(flatten)]
    load: LoadArgs,
}

#[derive(Debug, clap::Args)]
struct BenchGrpcArgs {
    /// The service's gRPC address, `host:port`.
    addr: String,
    /// The rate-limit domain.
    #[arg(long)]
    domain: String,
    #[arg(long = "descriptor", required = true, help = concat!("A descriptor, `key=value,key=value` (repeatable); ", key_placeholder!(), " becomes the key number"))]
    descriptors: Vec<String>,
    /// Units each request consumes (Envoy's `hits_addend`; 0 means 1).
    #[arg(long, default_value_t = 0)]
    hits: u32,
    /// h2 connections the workers share.
    #[arg(long, default_value_t = 2)]
    connections: usize,
    #[command(flatten)]
    load: LoadArgs,
}

#[derive(Debug, clap::Args)]
struct LoadArgs {
    /// Requests per second offered in all (open loop). Without it, every worker sends its next
    /// request as soon as the last is answered (closed loop), to find the maximum.
    #[arg(long)]
    rate: Option<f64>,
    /// Workers, each with one request in flight.
    #[arg(long, short = 'c', default_value_t = 32)]
    concurrency: usize,
    /// How long to measure, e.g. `10s`, `500ms`, `2m` (default 10s unless --requests is given).
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Stop after this many requests in all.
    #[arg(long)]
    requests: Option<u64>,
    /// Send for this long before measuring.
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    warmup: Duration,
    #[arg(long, default_value_t = 1, help = concat!("How many key numbers ", key_placeholder!(), " cycles through"))]
    keys: u64,
    /// How long one request may take before it counts as an error.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    timeout: Duration,
    /// Threads the generator runs on.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

impl LoadArgs {
    fn load(&self) -> sluice_server::bench::Load {
        let duration = match (self.duration, self.requests) {
            (None, None) => Some(Duration::from_secs(10)),
            (d, _) => d,
        };
        sluice_server::bench::Load {
            rate: self.rate,
            concurrency: self.concurrency,
            duration,
            requests: self.requests,
            warmup: self.warmup,
            keys: self.keys,
            timeout: self.timeout,
        }
    }
}

/// `250ms`, `10s`, `2m`, or a bare number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else {
        (text, 1.0)
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 500ms, 10s or 2m"))?;
    Duration::try_from_secs_f64(value * scale)
        .map_err(|_| format!("{text:?} is not a duration such as 500ms, 10s or 2m"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Validate { paths, store } => validate(&paths, store.as_deref()),
        Command::Serve(args) => exit(serve(args)),
        Command::Proxy(args) => exit(proxy(args)),
        Command::Bench { target } => exit(bench(target)),
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
        let settings = sluice_server::store_url::StoreSettings {
            prefix: args.store_prefix,
            timeout: Duration::from_millis(args.store_timeout_ms),
        };
        let store = sluice_server::store_url::open(&args.store, &settings).await?;
        // Rules the store cannot hold are refused now and on every reload, like invalid ones.
        let rules = sluice_rules::Reloader::with_check(args.config, store.rule_check())
            .map_err(|e| anyhow::anyhow!("invalid rules:\n{e}"))?;
        if rules.rules().gateway().is_none_or(|g| g.routes.is_empty()) {
            tracing::warn!("the rules have no `routes`; every request passes unlimited");
        }
        let _watcher = rules
            .watch(Duration::from_millis(args.reload_debounce_ms))
            .context("cannot watch the rule files for changes")?;
        let limiter = std::sync::Arc::new(sluice_http::Limiter::new(
            rules,
            store.store,
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

fn bench(target: BenchTarget) -> anyhow::Result<()> {
    use sluice_server::bench;
    let threads = match &target {
        BenchTarget::Http(a) => a.load.threads,
        BenchTarget::Grpc(a) => a.load.threads,
        BenchTarget::Upstream { .. } => 1,
    };
    let runtime = match threads {
        0 => anyhow::bail!("--threads must be at least 1"),
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    }
    .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let (report, json) = match target {
            BenchTarget::Upstream { listen } => {
                init_logging(LogFormat::Pretty);
                let listener = tokio::net::TcpListener::bind(listen)
                    .await
                    .with_context(|| format!("cannot listen on {listen}"))?;
                let upstream = bench::serve_upstream(listener)?;
                println!("serving a trivial 200 ok on http://{}", upstream.addr());
                shutdown_signal().await;
                upstream.shutdown().await;
                return Ok(());
            }
            BenchTarget::Http(a) => {
                let version = if a.h2 {
                    bench::Version::H2 {
                        connections: a.connections,
                    }
                } else {
                    bench::Version::Http1
                };
                let load = a.load.load();
                let target = bench::HttpTarget::new(
                    &a.url, a.method, &a.headers, a.body, version, load.keys,
                )?;
                (bench::run_http(target, load).await?, a.load.json)
            }
            BenchTarget::Grpc(a) => {
                let target = bench::GrpcTarget::new(
                    &a.addr,
                    a.domain,
                    &a.descriptors,
                    a.hits,
                    a.connections,
                )?;
                (bench::run_grpc(target, a.load.load()).await?, a.load.json)
            }
        };
        if json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{report}");
        }
        if report.allowed + report.limited == 0 {
            anyhow::bail!("no request was answered ({} failed)", report.error_count());
        }
        Ok(())
    })
}

fn validate(paths: &[PathBuf], store: Option<&str>) -> ExitCode {
    let check = match store
        .map(sluice_server::store_url::rule_check_for)
        .transpose()
    {
        Ok(check) => check,
        Err(e) => {
            eprintln!("sluice: {e}");
            return ExitCode::FAILURE;
        }
    };
    let loaded = RuleSet::load_all(paths).and_then(|rules| {
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
