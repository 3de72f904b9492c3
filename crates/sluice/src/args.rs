//! The argument groups `serve` and `proxy` share (rules, store, logging), so that one option
//! means one thing with one default everywhere.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use sluice_core::parse_duration_or_error;
use sluice_limiter::HeaderStyle;
use sluice_stores::StoreSettings;

/// Where the rules come from, and how reloads are paced.
#[derive(Debug, Args)]
pub(crate) struct RulesArgs {
    /// Rule file or directory (repeatable); hot-reloaded when it changes.
    #[arg(long, env = "SLUICE_CONFIG", required = true, value_delimiter = ',')]
    pub(crate) config: Vec<PathBuf>,
    /// How long the rule files must be quiet before a change is reloaded, e.g. `250ms`.
    #[arg(long, env = "SLUICE_RELOAD_DEBOUNCE", value_parser = parse_duration_or_error, default_value = "250ms")]
    pub(crate) reload_debounce: Duration,
}

/// How long clients may hold connections, and how long stopping may take.
#[derive(Debug, Args)]
pub(crate) struct ConnectionArgs {
    /// How long a client may take to send a request's head (from connecting, or from the end
    /// of its previous answer); a slower one is disconnected.
    #[arg(long, env = "SLUICE_HEADER_TIMEOUT", value_parser = parse_duration_or_error, default_value = "10s")]
    pub(crate) header_timeout: Duration,
    /// On SIGTERM, how long requests in flight may take to finish; then every connection
    /// still open is closed and the process exits 0.
    #[arg(long, env = "SLUICE_SHUTDOWN_TIMEOUT", value_parser = parse_duration_or_error, default_value = "30s")]
    pub(crate) shutdown_timeout: Duration,
    /// Open connections at most, per listener; more are closed as soon as they are accepted.
    /// Lowered to fit the open-files limit, which is raised to its hard limit at start.
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS", default_value_t = 16_384)]
    pub(crate) max_connections: usize,
    /// Open connections from one client address at most, per listener (raise it behind a load
    /// balancer, whose few addresses carry every client).
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS_PER_IP", default_value_t = 1_024)]
    pub(crate) max_connections_per_ip: usize,
}

impl ConnectionArgs {
    /// The limits, with the total lowered to what the open-files limit allows: three
    /// listeners may each fill it, and the process needs descriptors of its own (the store, the
    /// upstream, the rule files).
    pub(crate) fn limits(&self, open_files: u64) -> sluice_http::serve::ConnectionLimits {
        let fits = usize::try_from(open_files.saturating_sub(256) / 3).unwrap_or(usize::MAX);
        let max_connections = self.max_connections.min(fits.max(1));
        if max_connections < self.max_connections {
            tracing::warn!(
                open_files,
                asked = self.max_connections,
                max_connections,
                "the open-files limit holds fewer connections than --max-connections; each \
                 listener takes at most max_connections (raise the hard limit, `ulimit -Hn`, \
                 to serve more)"
            );
        }
        sluice_http::serve::ConnectionLimits {
            header_read: self.header_timeout,
            max_connections,
            max_per_ip: self.max_connections_per_ip,
            ..Default::default()
        }
    }

    /// The defaults of every option, as when none is given.
    pub(crate) fn defaults() -> Self {
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            connections: ConnectionArgs,
        }
        <Defaults as clap::Parser>::parse_from(["defaults"]).connections
    }
}

/// Where counters live.
#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// Where counters live: `memory`, `memory://?max_keys=N`, `redis://[user:pass@]host:port`,
    /// `rediss://…`, `redis+sentinel://host:port,…/master`, or `redis+cluster://host:port,…`.
    #[arg(long, env = "SLUICE_STORE", default_value = "memory")]
    pub(crate) store: String,
    /// The first part of every Redis key, so deployments sharing a Redis stay apart.
    #[arg(long, env = "SLUICE_STORE_PREFIX", default_value = "sluice")]
    pub(crate) store_prefix: String,
    /// Milliseconds one store call may take before the rule's on_store_error applies.
    #[arg(long, env = "SLUICE_STORE_TIMEOUT_MS", default_value_t = 50)]
    pub(crate) store_timeout_ms: u64,
}

impl StoreArgs {
    /// The key prefix and timeout, as the library takes them.
    pub(crate) fn settings(&self) -> StoreSettings {
        StoreSettings {
            prefix: self.store_prefix.clone(),
            timeout: Duration::from_millis(self.store_timeout_ms),
            tls_root_cert: None,
        }
    }
}

/// How the process logs.
#[derive(Debug, Args)]
pub(crate) struct LogArgs {
    /// Log format.
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value = "pretty")]
    pub(crate) log_format: LogFormat,
}

/// The log formats.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    /// For people.
    Pretty,
    /// One JSON object a line, for collectors.
    Json,
}

/// Which rate-limit fields an answer carries.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Headers {
    /// `RateLimit-Policy` and `RateLimit`.
    Ietf,
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset`.
    Legacy,
    /// Both sets.
    Both,
    /// Neither.
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

/// Starts logging, with `SLUICE_LOG` as the filter (`default_filter` without it).
pub(crate) fn init_logging(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    // Colour only for a person at a terminal: a file, a pipe or a log collector gets plain text,
    // and NO_COLOR (no-color.org) turns it off everywhere.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    match format {
        LogFormat::Pretty => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Runs `serve` (which starts a server and waits for a signal) on `runtime`; then stops it with
/// `stop`, giving requests in flight `deadline` to finish before the connections still open
/// are closed. Returns once everything is down, whatever the clients do.
pub(crate) fn run_until_stopped<T>(
    runtime: tokio::runtime::Runtime,
    deadline: Duration,
    serve: impl std::future::Future<Output = anyhow::Result<T>>,
    stop: impl FnOnce(T) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
) -> anyhow::Result<()> {
    let result = runtime.block_on(async move {
        let running = serve.await?;
        tracing::info!("shutting down: finishing requests in flight");
        if tokio::time::timeout(deadline, stop(running)).await.is_err() {
            tracing::warn!(
                ?deadline,
                "connections still open after the shutdown deadline; closing them"
            );
        }
        Ok(())
    });
    // Tasks still serving connections are dropped with the runtime; nothing waits on them.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Raises the soft open-files limit to the hard one, as nginx and Envoy do: the soft limit is
/// often 1,024 (systemd's default), which a few hundred idle clients exhaust. Returns the soft
/// limit now in force.
pub(crate) fn raise_open_files_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-files limit");
            rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft)
        }
    }
}

/// Starts logging and the async runtime, as every long-running command does.
pub(crate) fn start_runtime(log: &LogArgs) -> anyhow::Result<tokio::runtime::Runtime> {
    start_runtime_logging(log.log_format, "info")
}

/// Starts logging with `default_filter` and the async runtime.
pub(crate) fn start_runtime_logging(
    format: LogFormat,
    default_filter: &str,
) -> anyhow::Result<tokio::runtime::Runtime> {
    init_logging(format, default_filter);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}
