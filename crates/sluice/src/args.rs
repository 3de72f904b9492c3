//! The argument groups `serve` and `proxy` share (rules, store, logging), so that one option
//! means one thing with one default everywhere.

use std::path::PathBuf;
use std::time::Duration;

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

/// Open connections per listener when `--max-connections` is not given, if the open-files limit
/// holds them.
const DEFAULT_MAX_CONNECTIONS: usize = 16_384;

/// How long clients may hold connections, and how long stopping may take.
#[derive(Debug, Clone, Copy, Args)]
pub(crate) struct ConnectionArgs {
    /// How long a client may take to send a request's head (from connecting, or from the end
    /// of its previous answer); a slower one is disconnected.
    #[arg(long, env = "SLUICE_HEADER_TIMEOUT", value_parser = parse_duration_or_error, default_value = "10s")]
    pub(crate) header_timeout: Duration,
    /// How long a connection may go with no request in flight before it is closed (an h2
    /// client is sent GOAWAY, so nothing it sends at that moment is lost).
    #[arg(long, env = "SLUICE_IDLE_TIMEOUT", value_parser = parse_duration_or_error, default_value = "5m")]
    pub(crate) idle_timeout: Duration,
    /// How long what a connection has to send may make no progress (a client that stopped
    /// reading its answers) before the connection is closed.
    #[arg(long, env = "SLUICE_SEND_TIMEOUT", value_parser = parse_duration_or_error, default_value = "30s")]
    pub(crate) send_timeout: Duration,
    /// On SIGTERM, how long requests in flight may take to finish; then every connection
    /// still open is closed and the process exits 0.
    #[arg(long, env = "SLUICE_SHUTDOWN_TIMEOUT", value_parser = parse_duration_or_error, default_value = "30s")]
    pub(crate) shutdown_timeout: Duration,
    /// On SIGTERM, how long an HTTP/1.1 connection with nothing in flight is still read, so
    /// that a request its client already sent is answered (with `Connection: close`) rather
    /// than cut off unread; then it is closed.
    #[arg(long, env = "SLUICE_SHUTDOWN_DRAIN", value_parser = parse_duration_or_error, default_value = "1s")]
    pub(crate) shutdown_drain: Duration,
    /// Open connections at most, per listener; more are closed as soon as they are accepted.
    /// The open-files limit is raised to its hard limit at start; a number given here that does
    /// not fit in it is lowered to fit, with a warning [default: 16384, or what fits].
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS")]
    pub(crate) max_connections: Option<usize>,
    /// Open connections from one client address at most, per listener (raise it behind a load
    /// balancer, whose few addresses carry every client).
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS_PER_IP", default_value_t = 1_024)]
    pub(crate) max_connections_per_ip: usize,
}

impl ConnectionArgs {
    /// The limits, with the total lowered to what the open-files limit allows: three
    /// listeners may each fill it, and the process needs descriptors of its own (the store, the
    /// upstream, the rule files). Only a number the user asked for is worth a warning when it
    /// is lowered: the default is a ceiling, not a request, and most hosts' hard limit holds
    /// fewer than it, so warning about it would greet every default start with a false alarm.
    pub(crate) fn limits(&self, open_files: u64) -> sluice_http::serve::ConnectionLimits {
        let fits = usize::try_from(open_files.saturating_sub(256) / 3).unwrap_or(usize::MAX);
        let asked = self.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS);
        let max_connections = asked.min(fits.max(1));
        if max_connections < asked {
            if self.max_connections.is_some() {
                tracing::warn!(
                    open_files,
                    asked,
                    max_connections,
                    "the open-files limit holds fewer connections than --max-connections; each \
                     listener takes at most max_connections (raise the hard limit, `ulimit -Hn`, \
                     to serve more)"
                );
            } else {
                tracing::debug!(
                    open_files,
                    max_connections,
                    "each listener takes at most max_connections, what the open-files limit holds"
                );
            }
        }
        sluice_http::serve::ConnectionLimits {
            header_read: self.header_timeout,
            idle: self.idle_timeout,
            send: self.send_timeout,
            max_connections,
            max_per_ip: self.max_connections_per_ip,
            drain: self.shutdown_drain,
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
