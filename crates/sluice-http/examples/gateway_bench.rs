//! Added latency and throughput of `sluice proxy`: the same load generator hits a trivial
//! upstream directly and through the gateway, in the same run.
//!
//! `cargo run --release -p sluice-http --example gateway_bench [seconds] [connections]`
//!
//! 1. Maximum throughput: `connections` closed-loop workers for `seconds`, direct then proxied.
//! 2. Added latency: a fixed rate of half the proxied maximum, direct then proxied, each latency
//!    measured from the request's scheduled start (so a stall is not hidden), p50/p99/p99.9.
//!
//! Every proxied request is routed and decided on the memory store (a limit it never reaches).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sluice_core::MemoryStore;
use sluice_http::{Limiter, Metrics, Proxy, ProxyOptions};

const RULES: &str = r#"
domain: bench
descriptors:
  - key: client_ip
    rate_limit: {unit: second, requests_per_unit: 1000000000}
routes:
  - path: /api/*
    descriptors: [[{key: client_ip, from: client_ip}]]
"#;

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

async fn get(client: &HttpClient, uri: &http::Uri) -> bool {
    match client.get(uri.clone()).await {
        Ok(r) => {
            let ok = r.status().is_success();
            ok && r.into_body().collect().await.is_ok()
        }
        Err(_) => false,
    }
}

async fn max_throughput(client: &HttpClient, uri: &http::Uri, secs: u64, conns: usize) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (client, uri, done) = (client.clone(), uri.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                if get(&client, &uri).await {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    done.load(Ordering::Relaxed) as f64 / secs as f64
}

/// Latencies (µs) at a fixed rate, from each request's scheduled start.
async fn fixed_rate(client: &HttpClient, uri: &http::Uri, secs: u64, rate: f64) -> Vec<u64> {
    let interval = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now();
    let n = (rate * secs as f64) as u64;
    let mut tasks = Vec::with_capacity(n as usize);
    for i in 0..n {
        let scheduled = start + interval.mul_f64(i as f64);
        tokio::time::sleep_until(scheduled.into()).await;
        let (client, uri) = (client.clone(), uri.clone());
        tasks.push(tokio::spawn(async move {
            let ok = get(&client, &uri).await;
            ok.then(|| scheduled.elapsed().as_micros() as u64)
        }));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        if let Ok(Some(us)) = t.await {
            out.push(us);
        }
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

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
    let conns: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(32);

    let app = axum::Router::new().fallback(|| async { "ok" });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.yaml");
    std::fs::write(&path, RULES).unwrap();
    let rules = sluice_rules::Reloader::new(vec![path]).unwrap();
    let limiter = Arc::new(Limiter::new(
        rules,
        Arc::new(MemoryStore::new()),
        Arc::new(Metrics::new()),
    ));
    let mut options = ProxyOptions::new(format!("http://{upstream}").parse().unwrap());
    options.listen = "127.0.0.1:0".parse().unwrap();
    let proxy = Proxy::start(options, limiter).await.unwrap();

    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(conns * 2)
        .build_http();
    let direct: http::Uri = format!("http://{upstream}/api/x").parse().unwrap();
    let proxied: http::Uri = format!("http://{}/api/x", proxy.local_addr())
        .parse()
        .unwrap();
    // Warm both paths' connection pools.
    max_throughput(&client, &direct, 1, conns).await;
    max_throughput(&client, &proxied, 1, conns).await;

    let d = max_throughput(&client, &direct, secs, conns).await;
    let p = max_throughput(&client, &proxied, secs, conns).await;
    println!("max throughput, {conns} connections, {secs} s each:");
    println!("  direct  {d:>10.0} req/s");
    println!(
        "  proxied {p:>10.0} req/s  ({:.0}% of direct)",
        100.0 * p / d
    );

    // Half of the gateway's maximum: the load the target is stated at.
    let rate = p / 2.0;
    let ld = fixed_rate(&client, &direct, secs, rate).await;
    let lp = fixed_rate(&client, &proxied, secs, rate).await;
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
