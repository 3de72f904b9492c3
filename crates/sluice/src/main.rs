//! `sluice`: the rate-limit service, the gateway, a rule validator and a load generator, each a
//! thin wrapper around its library crate.

mod args;
mod bench_cmd;
mod listen_error;
mod proxy_cmd;
mod serve_cmd;
mod simulate_cmd;
mod start;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sluice_rules::{LoadOptions, RuleSet};

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
    Serve(serve_cmd::ServeArgs),
    /// Run the gateway: a reverse proxy that limits requests by the rules' routes.
    Proxy(proxy_cmd::ProxyArgs),
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
        return exit(serve_cmd::run_envoy_env());
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Validate {
            paths,
            store,
            merge_domains,
        } => validate(&paths, store.as_deref(), LoadOptions { merge_domains }),
        Command::Serve(args) => exit(serve_cmd::run(args)),
        Command::Proxy(args) => exit(proxy_cmd::run(args)),
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
            // Warnings, not errors: the rules load, but some of their routes are never limited.
            for unmatched in rules.unmatched_route_keys() {
                eprintln!("warning: {unmatched}");
            }
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
