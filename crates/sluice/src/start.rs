//! The one start-up path of the long-running commands, `serve` (from its options or as
//! envoyproxy/ratelimit) and `proxy`: logging, the async runtime, the open-files limit and the
//! connection limits that fit it, then the service's whole life in the library's
//! [`lifecycle::run`], stopped on SIGTERM or Ctrl-C within `--shutdown-timeout`.

use std::future::Future;
use std::time::Duration;

use anyhow::Context as _;
use sluice_http::lifecycle::{self, Lifecycle};
use sluice_http::serve::ConnectionLimits;

use crate::args::{ConnectionArgs, LogFormat};

/// Logs as `format` says (`default_filter` unless `SLUICE_LOG` is set), starts the runtime, and
/// runs the service that `start` starts with the connection limits, until SIGTERM or Ctrl-C;
/// then requests in flight get `connections.shutdown_timeout` to finish. Returns once
/// everything is down, whatever the clients do, or with the error the start failed with.
pub(crate) fn run_service<S, E, F>(
    format: LogFormat,
    default_filter: &str,
    connections: ConnectionArgs,
    start: impl FnOnce(ConnectionLimits) -> F,
) -> anyhow::Result<()>
where
    F: Future<Output = Result<S, E>>,
    S: Into<Lifecycle>,
    anyhow::Error: From<E>,
{
    let runtime = start_runtime(format, default_filter)?;
    let limits = connections.limits(raise_open_files_limit());
    let lived = runtime.block_on(lifecycle::run(
        start(limits),
        lifecycle::stop_signal(),
        connections.shutdown_timeout,
    ));
    // Tasks still serving connections are dropped with the runtime; nothing waits on them.
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(lived?)
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

/// Raises the soft open-files limit to the hard one, as nginx and Envoy do: the soft limit is
/// often 1,024 (systemd's default), which a few hundred idle clients exhaust. Returns the soft
/// limit now in force.
fn raise_open_files_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-files limit");
            rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft)
        }
    }
}

/// Starts logging with `default_filter` and the async runtime: a single-threaded one when the
/// process has one CPU to run on (pinned to one, or a container's quota of one) or
/// `TOKIO_WORKER_THREADS` is 1, one worker per CPU otherwise. On one CPU the multi-threaded
/// scheduler's one worker still pays for waking and stealing across threads it never has:
/// 3–4% of the CPU per answer on `/json` and through the gateway (`docs/BENCHMARKS.md`).
fn start_runtime(
    format: LogFormat,
    default_filter: &str,
) -> anyhow::Result<tokio::runtime::Runtime> {
    init_logging(format, default_filter);
    let threads = runtime_threads(std::env::var("TOKIO_WORKER_THREADS").ok().as_deref())?;
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads);
        builder
    };
    builder
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// How many threads run the service: `TOKIO_WORKER_THREADS` when set (tokio's own variable),
/// else the CPUs the process may run on.
fn runtime_threads(set: Option<&str>) -> anyhow::Result<usize> {
    match set {
        Some(text) => match text.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => anyhow::bail!("TOKIO_WORKER_THREADS must be a whole number above 0, not {text:?}"),
        },
        None => Ok(std::thread::available_parallelism().map_or(1, std::num::NonZero::get)),
    }
}

#[cfg(test)]
mod tests {
    use super::runtime_threads;

    #[test]
    fn the_runtime_has_the_threads_asked_for_or_one_per_cpu() {
        assert_eq!(runtime_threads(Some("1")).unwrap(), 1);
        assert_eq!(runtime_threads(Some(" 3 ")).unwrap(), 3);
        let cpus = std::thread::available_parallelism().unwrap().get();
        assert_eq!(runtime_threads(None).unwrap(), cpus);
        for bad in ["0", "-1", "two", ""] {
            let e = runtime_threads(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("TOKIO_WORKER_THREADS") && e.contains(bad), "{e}");
        }
    }
}
