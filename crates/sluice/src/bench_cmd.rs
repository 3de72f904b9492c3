//! `sluice bench`: its arguments, and running the load generator of the `sluice-bench` crate.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use std::fmt::Write as _;

use clap::Subcommand;
use clap::builder::StyledStr;
use clap::builder::styling::Style;
use sluice_bench as bench;
use sluice_core::parse_duration_or_error;

#[derive(Debug, Subcommand)]
pub(crate) enum BenchTarget {
    /// Load an HTTP endpoint: `/json`, `/v1/check`, a gateway, or the API behind it.
    Http(BenchHttpArgs),
    /// Load Envoy's rate-limit gRPC service (`ShouldRateLimit`).
    Grpc(BenchGrpcArgs),
    /// Usage calls against a budget: each request is one call spending a random number of units,
    /// admitted by reserve-then-settle (`/v1/reserve`, `/v1/settle`) or by Envoy's
    /// check-then-report (`/json` with `hits_addend` 0, then the units used).
    Usage(BenchUsageArgs),
    /// Serve a trivial `200 ok` to everything: the baseline other runs are compared with.
    Upstream {
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:3000")]
        listen: SocketAddr,
    },
    /// Relay TCP connections to another address, every byte held `--delay` in each direction:
    /// a network's round trip on one machine.
    Relay {
        /// Where to listen.
        #[arg(long)]
        listen: SocketAddr,
        /// Where to relay to.
        #[arg(long)]
        to: SocketAddr,
        /// How long each byte is held each way, such as `1ms` (the timer ticks every
        /// millisecond, so up to one more).
        #[arg(long, value_parser = parse_duration_or_error)]
        delay: Duration,
    },
}

/// A help text that shows the key placeholder, `{n}`, between `before` and `after`. clap turns
/// a literal `{n}` in help text into a line break, and an invisible character inside it would
/// be copied along with it; so the placeholder is written in clap's style for literals (bold)
/// as two styled runs, `{` and `n}`. A terminal shows `{n}` in bold, a pipe or a file gets the
/// plain `{n}`, and what a user copies from either is the placeholder itself.
fn key_help(before: &str, after: &str) -> StyledStr {
    let literal = Style::new().bold();
    let (on, off) = (literal.render(), literal.render_reset());
    let mut help = StyledStr::new();
    let _ = write!(help, "{before}`{on}{{{off}{on}n}}{off}`{after}");
    help
}

#[derive(Debug, clap::Args)]
pub(crate) struct BenchHttpArgs {
    #[arg(help = key_help("The URL, `http://host:port/path?query`; ", " becomes the key number"))]
    url: String,
    /// The request method.
    #[arg(long, short = 'X', default_value = "GET")]
    method: http::Method,
    #[arg(long = "header", short = 'H', help = key_help("A request header, `name: value` (repeatable); ", " becomes the key number"))]
    headers: Vec<String>,
    #[arg(long, short = 'd', help = key_help("A request body (JSON unless a content-type header says otherwise); ", " becomes the key number"))]
    body: Option<String>,
    /// Speak h2 with prior knowledge, the workers multiplexed over `--connections`.
    #[arg(long)]
    h2: bool,
    /// h2 connections the workers share (HTTP/1.1 opens one per worker).
    #[arg(long, default_value_t = 2)]
    connections: usize,
    /// Count a 2xx answer as limited when its body contains this text, for services that
    /// answer a denial with `200` and the verdict in the body (e.g. `"allowed":false`).
    #[arg(long, value_name = "TEXT")]
    limited_body: Option<String>,
    #[command(flatten)]
    load: LoadArgs,
}

#[derive(Debug, clap::Args)]
pub(crate) struct BenchGrpcArgs {
    /// The service's gRPC address, `host:port`.
    addr: String,
    /// The rate-limit domain.
    #[arg(long)]
    domain: String,
    #[arg(long = "descriptor", required = true, help = key_help("A descriptor, `key=value,key=value` (repeatable); ", " becomes the key number"))]
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

/// How a usage call is admitted, as the command line names it.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum FlowArg {
    /// Reserve the declared maximum, then settle with what was used.
    Reserve,
    /// Check with `hits_addend` 0 on `/json`, then report what was used (Envoy's flow).
    Report,
}

#[derive(Debug, clap::Args)]
pub(crate) struct BenchUsageArgs {
    /// The service's HTTP URL, `http://host:port`; several instances sharing a store take the
    /// calls round robin (worker by worker).
    #[arg(required = true)]
    urls: Vec<String>,
    /// How each call is admitted and charged.
    #[arg(long, value_enum, default_value = "reserve")]
    flow: FlowArg,
    /// The rate-limit domain.
    #[arg(long)]
    domain: String,
    #[arg(long = "descriptor", required = true, help = key_help("A descriptor, `key=value,key=value` (repeatable); ", " becomes the key number"))]
    descriptors: Vec<String>,
    /// The most a call may use: the amount a reservation takes.
    #[arg(long, default_value_t = 500)]
    declared: u64,
    /// The fewest units a call uses.
    #[arg(long, default_value_t = 50)]
    used_min: u64,
    /// The most units a call uses; each call's usage is uniform between the two.
    #[arg(long, default_value_t = 500)]
    used_max: u64,
    /// Seeds the usage amounts: the same seed spends alike.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The reservations' ttl, e.g. `2m` (default: the server's).
    #[arg(long)]
    ttl: Option<String>,
    /// The budget the run is measured against: the report adds what was admitted beyond it.
    #[arg(long)]
    budget: Option<u64>,
    #[command(flatten)]
    load: LoadArgs,
}

#[derive(Debug, clap::Args)]
pub(crate) struct LoadArgs {
    /// Requests per second offered in all (open loop). Without it, every worker sends its next
    /// request as soon as the last is answered (closed loop), to find the maximum.
    #[arg(long)]
    rate: Option<f64>,
    /// Workers, each with one request in flight.
    #[arg(long, short = 'c', default_value_t = 32)]
    concurrency: usize,
    /// How long to measure, e.g. `10s`, `500ms`, `2m`, `1h` (default 10s unless --requests is
    /// given).
    #[arg(long, value_parser = parse_duration_or_error)]
    duration: Option<Duration>,
    /// Stop after this many requests in all.
    #[arg(long)]
    requests: Option<u64>,
    /// Send for this long before measuring.
    #[arg(long, value_parser = parse_duration_or_error, default_value = "0s")]
    warmup: Duration,
    #[arg(long, default_value_t = 1, help = key_help("How many key numbers ", " cycles through"))]
    keys: u64,
    /// How long one request may take before it counts as an error.
    #[arg(long, value_parser = parse_duration_or_error, default_value = "10s")]
    timeout: Duration,
    /// Threads the generator runs on.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

impl LoadArgs {
    fn load(&self) -> sluice_bench::Load {
        let duration = match (self.duration, self.requests) {
            (None, None) => Some(Duration::from_secs(10)),
            (d, _) => d,
        };
        sluice_bench::Load {
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

pub(crate) fn run(target: BenchTarget) -> anyhow::Result<()> {
    let threads = match &target {
        BenchTarget::Http(a) => a.load.threads,
        BenchTarget::Grpc(a) => a.load.threads,
        BenchTarget::Usage(a) => a.load.threads,
        BenchTarget::Upstream { .. } | BenchTarget::Relay { .. } => 1,
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
                crate::start::init_logging(crate::args::LogFormat::Pretty, "info");
                let listener = tokio::net::TcpListener::bind(listen)
                    .await
                    .with_context(|| format!("cannot listen on {listen}"))?;
                let upstream = bench::serve_trivial_upstream(listener)?;
                println!("serving a trivial 200 ok on http://{}", upstream.addr());
                sluice_http::lifecycle::stop_signal().await;
                upstream.shutdown().await;
                return Ok(());
            }
            BenchTarget::Relay { listen, to, delay } => {
                crate::start::init_logging(crate::args::LogFormat::Pretty, "info");
                let listener = tokio::net::TcpListener::bind(listen)
                    .await
                    .with_context(|| format!("cannot listen on {listen}"))?;
                let relay = bench::serve_relay(listener, to, delay)?;
                println!("relaying {} to {to}, {delay:?} each way", relay.addr());
                sluice_http::lifecycle::stop_signal().await;
                relay.shutdown().await;
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
                let mut target = bench::HttpTarget::new(
                    &a.url, a.method, &a.headers, a.body, version, load.keys,
                )?;
                if let Some(text) = &a.limited_body {
                    target = target.limited_if_body_contains(text)?;
                }
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
            BenchTarget::Usage(a) => return usage(a).await,
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

async fn usage(a: BenchUsageArgs) -> anyhow::Result<()> {
    let flow = match a.flow {
        FlowArg::Reserve => bench::Flow::Reserve,
        FlowArg::Report => bench::Flow::Report,
    };
    let usage = bench::Usage {
        flow,
        declared: a.declared,
        used_min: a.used_min,
        used_max: a.used_max,
        seed: a.seed,
        ttl: a.ttl,
        budget: a.budget,
    };
    let target = bench::UsageTarget::new(&a.urls, &a.domain, &a.descriptors, usage)?;
    let report = bench::run_usage(target, a.load.load()).await?;
    if a.load.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    if report.run.allowed + report.run.limited == 0 {
        anyhow::bail!("no call was answered ({} failed)", report.run.error_count());
    }
    Ok(())
}
