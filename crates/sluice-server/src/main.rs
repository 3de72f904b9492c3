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
    /// Where counters live: `memory` or `memory://?max_keys=N`.
    #[arg(long, env = "SLUICE_STORE", default_value = "memory")]
    store: String,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Validate { paths } => validate(&paths),
        Command::Serve(args) => match serve(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sluice: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
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

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let mut options = ServeOptions::new(args.config);
        options.http_addr = args.http_addr;
        options.grpc_addr = args.grpc_addr;
        options.store = args.store;
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
