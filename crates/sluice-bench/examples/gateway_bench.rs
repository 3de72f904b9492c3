//! Added latency and throughput of `sluice proxy`: the same load hits a trivial upstream
//! directly and through the gateway, in the same run.
//!
//! ```text
//! gateway_bench [SECS] [CONNS]              everything in this one process, as a quick look
//! gateway_bench upstream LISTEN             only the trivial upstream, until killed
//! gateway_bench proxy LISTEN UPSTREAM [unrouted]
//!                                           only the gateway in front of UPSTREAM, until killed;
//!                                           `unrouted` forwards without deciding anything
//! gateway_bench load URL RATE SECS CONNS    only the fixed-rate load, against URL
//! gateway_bench max URL SECS CONNS          only the closed-loop load, against URL
//! ```
//!
//! `GATEWAY_BENCH_WORKERS=N` sets each process's tokio worker threads (by default one per CPU
//! it may run on). Run the pieces in separate processes, pinned with `taskset`, so that the
//! generator does not share the gateway's cores, as `scripts/bench.py peers` does (its method is
//! in docs/BENCHMARKS.md). Measured in one process,
//! the proxied path pays for the generator, the upstream and the gateway on the same cores.
//!
//! - Maximum throughput: `CONNS` keep-alive connections, each sending its next request as soon
//!   as the previous answer is read.
//! - Added latency: a fixed rate over `CONNS` keep-alive connections. Each connection has its
//!   own schedule, staggered so that the requests of all of them are evenly spread rather than
//!   fired together. A request's latency runs from its scheduled time when it had to wait for
//!   its connection (so a stall is charged to every request it delays), and from when it was
//!   sent when its connection was idle (so the generator's own 1 ms timer is not).
//!
//! Every proxied request is routed and decided on the memory store (a limit it never reaches),
//! so the whole decision path runs.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use sluice_gateway::{Gateway, GatewayOptions};

/// The allocator `sluice proxy` runs with, so that the gateway measured here costs what the
/// binary's does.
#[global_allocator]
static ALLOCATOR: sluice_alloc::Allocator = sluice_alloc::Allocator;

const RULES: &str = r#"
domain: bench
descriptors:
  - key: client_ip
    rate_limit: {unit: second, requests_per_unit: 1000000000}
routes:
  - path: /api/*
    descriptors: [[{key: client_ip, from: client_ip}]]
"#;

/// The path every request asks for: routed and limited by `RULES`.
const PATH: &str = "/api/x";

/// One keep-alive connection of the generator.
struct Connection {
    send: SendRequest<Empty<Bytes>>,
    host: http::HeaderValue,
}

impl Connection {
    async fn open(addr: SocketAddr) -> std::io::Result<Connection> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(connection);
        let host = http::HeaderValue::from_str(&addr.to_string()).map_err(std::io::Error::other)?;
        Ok(Connection { send, host })
    }

    /// One request; whether it got a 2xx answer, read to the end.
    async fn get(&mut self) -> bool {
        let request = http::Request::get(PATH)
            .header(http::header::HOST, self.host.clone())
            .body(Empty::new())
            .expect("a static request is valid");
        if self.send.ready().await.is_err() {
            return false;
        }
        match self.send.send_request(request).await {
            Ok(r) => r.status().is_success() && r.into_body().collect().await.is_ok(),
            Err(_) => false,
        }
    }
}

async fn open_all(addr: SocketAddr, conns: usize) -> Vec<Connection> {
    let mut out = Vec::with_capacity(conns);
    for _ in 0..conns {
        out.push(Connection::open(addr).await.expect("cannot connect"));
    }
    out
}

/// Requests per second over `conns` closed-loop connections for `secs`.
async fn max_throughput(addr: SocketAddr, secs: f64, conns: usize) -> f64 {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = open_all(addr, conns)
        .await
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let mut done = 0u64;
                while Instant::now() < end {
                    done += u64::from(c.get().await);
                }
                done
            })
        })
        .collect();
    let mut done = 0;
    for t in tasks {
        done += t.await.unwrap_or(0);
    }
    done as f64 / secs
}

/// Latencies (µs, sorted) of `rate` requests a second for `secs`, over `conns` connections.
async fn fixed_rate(addr: SocketAddr, rate: f64, secs: f64, conns: usize) -> Vec<u64> {
    let connections = open_all(addr, conns).await;
    // Connection `c` sends requests c, c + conns, c + 2·conns… of one evenly spaced schedule.
    let spacing = Duration::from_secs_f64(1.0 / rate);
    let total = (rate * secs) as u64;
    let start = Instant::now() + Duration::from_millis(10);
    let tasks: Vec<_> = connections
        .into_iter()
        .enumerate()
        .map(|(c, mut conn)| {
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut idle_since = start;
                let mut k = c as u64;
                while k < total {
                    let scheduled = start + spacing.mul_f64(k as f64);
                    tokio::time::sleep_until(scheduled.into()).await;
                    let sent = Instant::now();
                    let from = if idle_since <= scheduled {
                        sent
                    } else {
                        scheduled
                    };
                    let ok = conn.get().await;
                    idle_since = Instant::now();
                    if ok {
                        latencies.push(idle_since.duration_since(from).as_micros() as u64);
                    }
                    k += conns as u64;
                }
                latencies
            })
        })
        .collect();
    let mut out = Vec::with_capacity(total as usize);
    for t in tasks {
        out.extend(t.await.unwrap_or_default());
    }
    out.sort_unstable();
    out
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn serve_upstream(listener: tokio::net::TcpListener) {
    let upstream = sluice_bench::serve_trivial_upstream(listener).expect("the upstream");
    std::future::pending::<()>().await;
    upstream.shutdown().await;
}

/// The gateway over `rules`, on the memory store.
async fn start_proxy(
    listen: SocketAddr,
    upstream: SocketAddr,
    rules: &str,
) -> (Gateway, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("bench.yaml");
    std::fs::write(&path, rules).expect("the rules file");
    let mut options = GatewayOptions::new(
        vec![path],
        format!("http://{upstream}").parse().expect("a URI"),
    );
    options.listen = listen;
    let gateway = Gateway::start(options).await.expect("the gateway");
    (gateway, dir)
}

fn addr_of(url: &str) -> SocketAddr {
    let uri: http::Uri = url.parse().expect("a URL such as http://127.0.0.1:9000");
    uri.authority()
        .expect("a URL with host:port")
        .as_str()
        .parse()
        .expect("a numeric host:port")
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> T {
    args.get(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("argument {i} should be {what}"))
}

fn main() {
    // `GATEWAY_BENCH_WORKERS` sets the runtime's worker threads; by default there is one per
    // CPU the process may run on, as in `sluice proxy`.
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = std::env::var("GATEWAY_BENCH_WORKERS")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        runtime.worker_threads(n);
    }
    let runtime = runtime.enable_all().build().expect("a runtime");
    runtime.block_on(run());
}

async fn run() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("upstream") => {
            let listen: SocketAddr = arg(&args, 2, "the address to listen on");
            let listener = tokio::net::TcpListener::bind(listen).await.expect("bind");
            serve_upstream(listener).await;
        }
        Some("proxy") => {
            let listen: SocketAddr = arg(&args, 2, "the address to listen on");
            let upstream: SocketAddr = arg(&args, 3, "the upstream's host:port");
            // Without routes nothing is decided: what forwarding alone costs.
            let rules = match args.get(4).map(String::as_str) {
                Some("unrouted") => "domain: bench\ndescriptors: []\n",
                _ => RULES,
            };
            let _proxy = start_proxy(listen, upstream, rules).await;
            std::future::pending::<()>().await;
        }
        Some("load") => {
            let addr = addr_of(&args[2]);
            let rate: f64 = arg(&args, 3, "requests per second");
            let secs: f64 = arg(&args, 4, "seconds");
            let conns: usize = arg(&args, 5, "connections");
            let l = fixed_rate(addr, rate, secs, conns).await;
            let expected = (rate * secs) as usize;
            println!(
                "rate {rate:.0}/s n {} of {expected} p50 {} p90 {} p99 {} p99.9 {} max {} µs",
                l.len(),
                pct(&l, 0.50),
                pct(&l, 0.90),
                pct(&l, 0.99),
                pct(&l, 0.999),
                l.last().copied().unwrap_or(0),
            );
        }
        Some("max") => {
            let addr = addr_of(&args[2]);
            let secs: f64 = arg(&args, 3, "seconds");
            let conns: usize = arg(&args, 4, "connections");
            println!("{:.0} req/s", max_throughput(addr, secs, conns).await);
        }
        _ => all_in_one(&args).await,
    }
}

/// The upstream, the gateway and the generator in this one process.
async fn all_in_one(args: &[String]) {
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let conns: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(32);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let upstream = listener.local_addr().expect("an address");
    tokio::spawn(serve_upstream(listener));
    let (proxy, _dir) =
        start_proxy("127.0.0.1:0".parse().expect("an address"), upstream, RULES).await;
    let proxied = proxy.local_addr();

    // Warm both paths, the gateway's upstream pool included.
    max_throughput(upstream, 1.0, conns).await;
    max_throughput(proxied, 1.0, conns).await;

    let d = max_throughput(upstream, secs, conns).await;
    let p = max_throughput(proxied, secs, conns).await;
    println!("max throughput, {conns} connections, {secs} s each:");
    println!("  direct  {d:>10.0} req/s");
    println!(
        "  proxied {p:>10.0} req/s  ({:.0}% of direct)",
        100.0 * p / d
    );

    // Half of the gateway's maximum: the load the target is stated at.
    let rate = p / 2.0;
    let ld = fixed_rate(upstream, rate, secs, conns).await;
    let lp = fixed_rate(proxied, rate, secs, conns).await;
    println!("latency at {rate:.0} req/s (half the proxied maximum), µs:");
    println!(
        "  {:<8} {:>8} {:>8} {:>8} {:>8}",
        "", "n", "p50", "p99", "p99.9"
    );
    for (name, l) in [("direct", &ld), ("proxied", &lp)] {
        println!(
            "  {name:<8} {:>8} {:>8} {:>8} {:>8}",
            l.len(),
            pct(l, 0.50),
            pct(l, 0.99),
            pct(l, 0.999)
        );
    }
    println!(
        "  added p50 {} µs, p99 {} µs",
        pct(&lp, 0.50) as i64 - pct(&ld, 0.50) as i64,
        pct(&lp, 0.99) as i64 - pct(&ld, 0.99) as i64
    );
    proxy.shutdown().await;
}
