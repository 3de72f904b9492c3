//! Decisions per second of the Redis store against `redis-benchmark` running the same `EVALSHA`
//! with `-P 16`: the ceiling of what one Redis core does with this script.
//!
//! Run: `cargo bench -p sluice-redis --bench throughput`. It starts its own `redis-server` on a
//! free loopback port (or uses `SLUICE_BENCH_REDIS=redis://host:port`), and prints a Markdown
//! table for `docs/BENCHMARKS.md`. All of it runs on one machine, so the store's client, Redis
//! and `redis-benchmark` share its cores: the ratio is what matters, measured in the same run.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::{Check, Gcra, Policy, Rate, Store, Timestamp};
use sluice_redis::testing::{RedisServer, push_check};
use sluice_redis::{RedisOptions, RedisStore};

/// Distinct counters, as `redis-benchmark -r` spreads its keys.
const KEYS: usize = 10_000;
/// Requests per measurement.
const REQUESTS: usize = 200_000;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One check of `policy` at cost 1 as the store sends it: KEYS[1]; ARGV offset 0, commit, then
/// the check's arguments as the store encodes them.
fn check_evalsha(sha: &str, policy: &Policy) -> Vec<String> {
    let mut command = ["EVALSHA", sha, "1", "bench:{rb:__rand_int__}", "0", "1"]
        .map(str::to_owned)
        .to_vec();
    // The application clock only places clock-aligned windows; GCRA has none.
    push_check(&mut command, policy, 1, Timestamp::EPOCH, "").expect("a policy Redis holds");
    command
}

/// `redis-benchmark -P 16` running `command`; returns calls per second.
fn redis_benchmark(port: u16, clients: usize, command: &[String]) -> f64 {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-n", &REQUESTS.to_string(), "-c", &clients.to_string()])
        .args(["-P", "16", "-r", &KEYS.to_string(), "-q"])
        .args(command)
        .output()
        .expect("redis-benchmark runs");
    let text = String::from_utf8_lossy(&out.stdout);
    // "EVALSHA ...: 123456.78 requests per second, p50=0.1 msec"
    text.split(':')
        .flat_map(|part| part.split_whitespace().next())
        .filter_map(|w| w.parse::<f64>().ok())
        .next_back()
        .or_else(|| {
            text.split_whitespace()
                .collect::<Vec<_>>()
                .windows(3)
                .find(|w| w[1] == "requests" && w[2] == "per")
                .and_then(|w| w[0].parse().ok())
        })
        .unwrap_or_else(|| panic!("cannot read redis-benchmark's output: {text}"))
}

/// The store at full speed: `tasks` concurrent callers, `REQUESTS` decisions in all.
async fn store_max(store: &RedisStore, policy: &Arc<Policy>, tasks: usize) -> (f64, Vec<Duration>) {
    let started = Instant::now();
    let per_task = REQUESTS / tasks;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(per_task);
                for i in 0..per_task {
                    let key = format!("k{}", (t * per_task + i) * 7919 % KEYS);
                    let t0 = Instant::now();
                    let d = store.check(&[Check::new(&key, &policy, 1)]).await;
                    lat.push(t0.elapsed());
                    assert!(d.is_ok(), "{d:?}");
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(REQUESTS);
    for h in handles {
        lat.extend(h.await.unwrap());
    }
    let rate = lat.len() as f64 / started.elapsed().as_secs_f64();
    lat.sort_unstable();
    (rate, lat)
}

/// The store at a fixed offered rate, for latency at partial load. The callers' schedules are
/// staggered evenly over one interval, so that requests arrive spread out rather than in bursts
/// of `tasks`, and each latency runs from when the request was due, not from when it was sent:
/// a request held up behind a slow one counts its wait (no coordinated omission). Returns the
/// latencies from the due times, and from the sends: the difference is time spent waiting to be
/// sent, which includes tokio's timer granularity of a millisecond.
async fn store_at(
    store: &RedisStore,
    policy: &Arc<Policy>,
    rate: f64,
    secs: u64,
) -> (Vec<Duration>, Vec<Duration>) {
    let tasks: u32 = 64;
    let interval = Duration::from_secs_f64(f64::from(tasks) / rate);
    let start = tokio::time::Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move {
                let first = start + interval * t / tasks;
                let mut tick = tokio::time::interval_at(first, interval);
                // Late ticks fire at once and keep their due times, so the schedule holds.
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut lat = Vec::new();
                let mut sent_lat = Vec::new();
                let mut i = 0;
                loop {
                    let due = tick.tick().await;
                    if due >= deadline {
                        break;
                    }
                    let key = format!("h{}", (t as usize * 100_003 + i) % KEYS);
                    i += 1;
                    let sent = tokio::time::Instant::now();
                    let d = store.check(&[Check::new(&key, &policy, 1)]).await;
                    lat.push(due.elapsed());
                    sent_lat.push(sent.elapsed());
                    assert!(d.is_ok(), "{d:?}");
                }
                (lat, sent_lat)
            })
        })
        .collect();
    let (mut lat, mut sent_lat) = (Vec::new(), Vec::new());
    for h in handles {
        let (l, s) = h.await.unwrap();
        lat.extend(l);
        sent_lat.extend(s);
    }
    lat.sort_unstable();
    sent_lat.sort_unstable();
    (lat, sent_lat)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let own_server;
    let (url, port) = match std::env::var("SLUICE_BENCH_REDIS") {
        Ok(url) => {
            let port = url
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or(6379);
            (url, port)
        }
        Err(_) => {
            own_server = RedisServer::start();
            (own_server.url(), own_server.port)
        }
    };
    runtime.block_on(async {
        let options = RedisOptions::default()
            .prefix("bench")
            .timeout(Duration::from_secs(2));
        let store = RedisStore::connect(&url, options).await.expect("connect");
        let policy = Arc::new(Policy::from(
            Gcra::new(Rate::per_second(1_000), 1_000_000).expect("valid"),
        ));
        // Warm up: loads the script and creates the counters.
        store_max(&store, &policy, 64).await;
        let sha = store.check_script_sha().to_owned();
        let trivial: Vec<String> = ["EVAL", "return 1", "0"].map(str::to_owned).to_vec();
        let floor = redis_benchmark(port, 50, &trivial);
        let ceiling = redis_benchmark(port, 50, &check_evalsha(&sha, &policy));
        println!("| measurement | decisions/s | ratio to ceiling | p50 | p99 |");
        println!("|---|---:|---:|---:|---:|");
        println!("| redis-benchmark EVAL \"return 1\" -P 16 (an empty script, for scale) | {floor:.0} | {:.2} | | |", floor / ceiling);
        println!("| redis-benchmark EVALSHA -P 16, 50 clients (ceiling) | {ceiling:.0} | 1.00 | | |");
        let mut best = 0.0_f64;
        for tasks in [64, 256, 1024] {
            let (rate, lat) = store_max(&store, &policy, tasks).await;
            best = best.max(rate);
            println!(
                "| RedisStore::check, {tasks} concurrent callers | {rate:.0} | {:.2} | {:?} | {:?} |",
                rate / ceiling,
                percentile(&lat, 0.5),
                percentile(&lat, 0.99)
            );
        }
        let half = best / 2.0;
        let (lat, sent_lat) = store_at(&store, &policy, half, 5).await;
        println!(
            "| RedisStore::check at half of its maximum ({half:.0}/s offered on staggered schedules, {} done in 5 s; latency from each request's due time) | {:.0} | {:.2} | {:?} | {:?} |",
            lat.len(),
            lat.len() as f64 / 5.0,
            lat.len() as f64 / 5.0 / ceiling,
            percentile(&lat, 0.5),
            percentile(&lat, 0.99)
        );
        println!(
            "| the same requests, latency from when each was sent | | | {:?} | {:?} |",
            percentile(&sent_lat, 0.5),
            percentile(&sent_lat, 0.99)
        );
    });
}
