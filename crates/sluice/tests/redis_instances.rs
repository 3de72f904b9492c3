//! Several `sluice serve` processes sharing one Redis (or a 3-master Cluster) enforce one exact
//! limit between them, for every algorithm, and keep it across a restart. Real processes, a real
//! `redis-server`, real HTTP.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sluice_redis::testing::{RedisCluster, RedisServer, unique_prefix};
use sluice_test_support::window::{LatestWindow, clock_window};
use sluice_test_support::{
    ServeProcess, Spawned, eventually, free_addr, rules_file, spawn_listening,
};

/// Every algorithm with a limit of 50 that does not refill while a test runs.
const RULES: &str = r#"
domain: multi
descriptors:
  - key: token_bucket
    rate_limit: {algorithm: token_bucket, requests_per_unit: 1, unit: hour, burst: 50}
  - key: gcra
    rate_limit: {algorithm: gcra, requests_per_unit: 1, unit: hour, burst: 50}
  - key: leaky_queue
    rate_limit: {algorithm: leaky_queue, requests_per_unit: 1, unit: hour, queue_size: 49, max_wait: 100h}
  - key: fixed_window
    rate_limit: {algorithm: fixed_window, alignment: first_request, requests_per_unit: 50, window: 1h}
  - key: sliding_log
    rate_limit: {algorithm: sliding_log, requests_per_unit: 50, window: 1h}
  - key: sliding_counter
    rate_limit: {algorithm: sliding_counter, requests_per_unit: 50, window: 30d}
  - key: global
    rate_limit: {algorithm: fixed_window, alignment: first_request, requests_per_unit: 30, window: 1h}
"#;

/// The sliding counter's window in [`RULES`]. Unlike every other limit there, its windows are
/// aligned to the clock: they start on multiples of 30 days since the epoch.
const SLIDING_COUNTER_WINDOW: Duration = Duration::from_secs(30 * 86_400);

const ALGORITHMS: [&str; 6] = [
    "token_bucket",
    "gcra",
    "leaky_queue",
    "fixed_window",
    "sliding_log",
    "sliding_counter",
];

/// A `sluice serve` child process, killed by PID when dropped.
struct Instance {
    _process: ServeProcess,
    http: String,
}

impl Instance {
    fn start(rules: &Path, store: &str, prefix: &str) -> Instance {
        Instance::start_on(rules, store, prefix, None)
    }

    /// An instance whose runtime has `threads` threads (one is a single-threaded runtime, as
    /// on one CPU), or one per CPU.
    fn start_on(rules: &Path, store: &str, prefix: &str, threads: Option<&str>) -> Instance {
        let mut builder = ServeProcess::builder(env!("CARGO_BIN_EXE_sluice"))
            .args(["--store", store, "--store-prefix", prefix])
            .args(["--store-timeout-ms", "5000"])
            .config(rules);
        if let Some(threads) = threads {
            builder = builder.env("TOKIO_WORKER_THREADS", threads);
        }
        let process = builder.start();
        Instance {
            http: format!("http://{}", process.http()),
            _process: process,
        }
    }
}

fn body(descriptors: &[(&str, &str)]) -> Value {
    let descriptors: Vec<Value> = descriptors
        .iter()
        .map(|(k, v)| json!({"entries": [{"key": k, "value": v}]}))
        .collect();
    json!({"domain": "multi", "descriptors": descriptors})
}

/// Sends `total` requests with `body`, from 64 concurrent clients spread over `instances`, and
/// counts how many were admitted.
async fn admitted(instances: &[String], body: Value, total: usize) -> usize {
    admitted_by(instances, body, total, 64).await
}

/// [`admitted`] with `clients` concurrent clients.
async fn admitted_by(instances: &[String], body: Value, total: usize, clients: usize) -> usize {
    let client = sluice_testing::long_lived_client();
    let body = Arc::new(body);
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (client, body) = (client.clone(), body.clone());
            let urls: Vec<String> = instances.iter().map(|u| format!("{u}/v1/check")).collect();
            tokio::spawn(async move {
                let mut ok = 0;
                for i in (c..total).step_by(clients) {
                    let r = client
                        .post(&urls[i % urls.len()])
                        .json(&*body)
                        .send()
                        .await
                        .unwrap();
                    match r.status().as_u16() {
                        200 => ok += 1,
                        429 => {}
                        other => panic!("unexpected status {other}: {}", r.text().await.unwrap()),
                    }
                }
                ok
            })
        })
        .collect();
    let mut sum = 0;
    for t in tasks {
        sum += t.await.unwrap();
    }
    sum
}

/// [`admitted`] for `total` requests on `algorithm`'s counter `hot`. A window of the sliding
/// counter that ends during its burst splits the count between two windows (and the estimate,
/// which weighs the window before rounded down, may then admit one more than the limit): the
/// burst is sent again, once, on a fresh counter in the new window, where none can end for 30
/// days.
async fn admitted_in_one_window(instances: &[String], algorithm: &str, total: usize) -> usize {
    let start = clock_window(SLIDING_COUNTER_WINDOW);
    let n = admitted(instances, body(&[(algorithm, "hot")]), total).await;
    if algorithm != "sliding_counter" || clock_window(SLIDING_COUNTER_WINDOW) == start {
        return n;
    }
    let start = clock_window(SLIDING_COUNTER_WINDOW);
    let n = admitted(instances, body(&[(algorithm, "hot-again")]), total).await;
    assert_eq!(
        clock_window(SLIDING_COUNTER_WINDOW),
        start,
        "two windows of 30 days ended within one test"
    );
    n
}

async fn remaining(instance: &str, descriptor: (&str, &str)) -> u64 {
    let client = sluice_testing::long_lived_client();
    sluice_testing::look(&client, instance, body(&[descriptor])).await["remaining"]
        .as_u64()
        .unwrap()
}

/// `cluster`: the store is a Redis Cluster, where a request's keys in different slots are
/// decided apart.
async fn exact_across_instances(store: &str, cluster: bool) {
    let (rules, _dir) = rules_file("rules.yaml", RULES);
    let prefix = unique_prefix();
    // One on a single-threaded runtime, as a process on one CPU runs, one on two threads, one
    // on one per CPU: the store's calls are batched per runtime either way.
    let instances: Vec<Instance> = [Some("1"), Some("2"), None]
        .into_iter()
        .map(|threads| Instance::start_on(&rules, store, &prefix, threads))
        .collect();
    let urls: Vec<String> = instances.iter().map(|i| i.http.clone()).collect();
    for algorithm in ALGORITHMS {
        let n = admitted_in_one_window(&urls, algorithm, 150).await;
        assert_eq!(n, 50, "{algorithm} on {store}");
    }
    // Two limits per request, on counters in different slots. On one server both are decided
    // by one script: exactly the smaller limit passes. On a Cluster each slot decides on its own
    // and a request refused by one is refunded by the others (docs/redis-store.md, "Across
    // masters"): never more than the limit, and transiently stricter, as a request racing a
    // refused one may find the units it holds until its refund taken. Afterwards, the counters
    // are where all-or-nothing leaves them: requests one at a time take exactly what is left of
    // the smaller limit, and the refused requests took nothing from the larger one.
    let pair = body(&[("fixed_window", "pair"), ("global", "pair")]);
    let n = admitted(&urls, pair.clone(), 90).await;
    if cluster {
        assert!(n <= 30, "multi-limit on {store}: {n} admitted");
    } else {
        assert_eq!(n, 30, "multi-limit on {store}");
    }
    let after = admitted_by(&urls, pair, 30 - n + 3, 1).await;
    assert_eq!(n + after, 30, "multi-limit on {store}: {n}, then {after}");
    assert_eq!(remaining(&urls[0], ("fixed_window", "pair")).await, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_one_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    exact_across_instances(&redis.url(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_a_cluster_admit_exactly_the_limit() {
    let cluster = RedisCluster::start();
    exact_across_instances(&cluster.url(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_instance_keeps_its_limits() {
    let redis = RedisServer::start();
    let (rules, _dir) = rules_file("rules.yaml", RULES);
    let prefix = unique_prefix();
    let first = Instance::start(&rules, &redis.url(), &prefix);
    let n = admitted(
        std::slice::from_ref(&first.http),
        body(&[("sliding_log", "r")]),
        50,
    )
    .await;
    assert_eq!(n, 50);
    drop(first);
    let second = Instance::start(&rules, &redis.url(), &prefix);
    let n = admitted(
        std::slice::from_ref(&second.http),
        body(&[("sliding_log", "r")]),
        10,
    )
    .await;
    assert_eq!(n, 0, "the new process sees the old process's counts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_answers_follow_on_store_error_and_stay_fast() {
    let mut redis = RedisServer::start();
    // Windows from the first request: one aligned to the clock could end between the checks
    // that use a limit up and the one that must be refused.
    let (path, _dir) = rules_file(
        "rules.yaml",
        "domain: multi\ndescriptors:\n  - key: open\n    rate_limit: {unit: hour, requests_per_unit: 1, alignment: first_request}\n  - key: closed\n    on_store_error: deny\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n  - key: local\n    on_store_error: local\n    rate_limit: {unit: hour, requests_per_unit: 2, alignment: first_request}\n",
    );
    let instance = Instance::start(&path, &redis.url(), &unique_prefix());
    let client = sluice_testing::long_lived_client();
    let status = |d: (&'static str, &'static str)| {
        let (client, url) = (client.clone(), format!("{}/v1/check", instance.http));
        async move {
            client
                .post(url)
                .json(&body(&[d]))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(status(("open", "a")).await, 200);
    assert_eq!(status(("open", "a")).await, 429, "Redis counts");
    redis.kill();
    // Fail open, fail closed, and limit locally, each as its rule says.
    for _ in 0..5 {
        assert_eq!(status(("open", "a")).await, 200);
        assert_eq!(status(("closed", "b")).await, 429);
    }
    assert_eq!(status(("local", "c")).await, 200);
    assert_eq!(status(("local", "c")).await, 200);
    assert_eq!(
        status(("local", "c")).await,
        429,
        "limited in memory while Redis is away"
    );
    // The breaker opened: further calls fail at once instead of waiting out the store's 5s
    // timeout each, which the short-circuit counter shows without timing anything.
    for _ in 0..20 {
        assert_eq!(status(("open", "a")).await, 200);
    }
    let metrics = client
        .get(format!("{}/metrics", instance.http))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"sluice_store_breaker_state{state="closed"} 0"#),
        "{metrics}"
    );
    let short_circuited: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sluice_store_short_circuited_total "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        short_circuited >= 10,
        "{short_circuited} calls short-circuited"
    );
    assert!(metrics.contains(r#"outcome="store_error""#));
    let ready = client
        .get(format!("{}/readyz", instance.http))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 503);
    // Back: exact limiting resumes (this Redis keeps no data across the restart).
    redis.restart();
    eventually("limiting resumes on Redis", || async {
        status(("closed", "b")).await == 200
    })
    .await;
    assert_eq!(status(("open", "fresh")).await, 200);
    assert_eq!(
        status(("open", "fresh")).await,
        429,
        "counted in Redis again"
    );
}

/// A limit over a window the redis store cannot hold (Lua doubles: about 417 days for a fixed
/// window), on line 4.
const TOO_LONG_FOR_REDIS: &str = "domain: multi
descriptors:
  - key: user
    rate_limit: {name: per_user, requests_per_unit: 10, window: 500d}
";

/// `sluice serve` and `sluice proxy` on Redis refuse to start on rules with a limit Redis cannot
/// hold, naming where it is written; on the memory store, which holds it, the same rules serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_redis_cannot_hold_keep_serve_from_starting_on_redis_only() {
    let redis = RedisServer::start();
    let (path, _dir) = rules_file("rules.yaml", TOO_LONG_FOR_REDIS);
    let expected = format!(
        "{}:4:17: rule \"per_user\" cannot be held by the redis store: the window of 500d is \
         longer than the redis store can hold for a fixed window (about 417 days",
        path.display()
    );
    let serve = [
        "serve",
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
    ];
    let proxy = [
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        "http://127.0.0.1:9",
    ];
    for command in [serve, proxy] {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(command)
            .args(["--store", &redis.url(), "--config"])
            .arg(&path)
            .env("SLUICE_LOG", "warn")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: {stderr}", command[0]);
        assert!(stderr.contains(&expected), "{}: {stderr}", command[0]);
    }

    let memory = Instance::start(&path, "memory", &unique_prefix());
    let status = sluice_testing::long_lived_client()
        .post(format!("{}/v1/check", memory.http))
        .json(&body(&[("user", "a")]))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 200);
}

/// Envoy's `unit: year`, a window past 2⁵³ ns, loads on Redis and limits exactly there, shared
/// by two instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_yearly_limit_is_enforced_on_redis() {
    let redis = RedisServer::start();
    let (path, _dir) = rules_file(
        "rules.yaml",
        "domain: multi\ndescriptors:\n  - key: user\n    rate_limit: {unit: year, requests_per_unit: 3}\n",
    );
    let prefix = unique_prefix();
    let (a, b) = (
        Instance::start(&path, &redis.url(), &prefix),
        Instance::start(&path, &redis.url(), &prefix),
    );
    let client = sluice_testing::long_lived_client();
    // Envoy's years are aligned to the clock: one can end between two checks (at the turn of a
    // year, UTC). The checks, alternating between the instances, go on until one year holds
    // five, which must be these.
    let mut year = LatestWindow::new();
    while year.len() < 5 {
        let instance = [&a, &b][year.len() % 2];
        let r = client
            .post(format!("{}/v1/check", instance.http))
            .json(&body(&[("user", "yearly")]))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let answer: Value = r.json().await.unwrap();
        let reset = answer["descriptors"][0]["limits"][0]["reset_after"]
            .as_f64()
            .unwrap_or_else(|| panic!("{answer}"));
        year.push(status, Duration::from_secs_f64(reset));
    }
    assert_eq!(year.answers(), [200, 200, 200, 429, 429]);
}

/// A reload to rules with a limit Redis cannot hold is refused like an invalid file: the answer
/// names where the limit is written, and the old rules stay in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_to_rules_redis_cannot_hold_keeps_the_old_rules() {
    let redis = RedisServer::start();
    let (path, _dir) = rules_file(
        "rules.yaml",
        "domain: multi\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1, alignment: first_request}\n",
    );
    let instance = Instance::start(&path, &redis.url(), &unique_prefix());
    std::fs::write(&path, TOO_LONG_FOR_REDIS).unwrap();
    let client = sluice_testing::long_lived_client();
    let reload = client
        .post(format!("{}/v1/reload", instance.http))
        .send()
        .await
        .unwrap();
    assert_eq!(reload.status().as_u16(), 422);
    let problem: Value = reload.json().await.unwrap();
    let detail = problem["detail"].as_str().unwrap_or_default();
    let location = format!("{}:4:17: rule \"per_user\" cannot be held", path.display());
    assert!(detail.contains(&location), "{problem}");
    let status = |user: &'static str| {
        let (client, url) = (client.clone(), format!("{}/v1/check", instance.http));
        async move {
            let r = client.post(url).json(&body(&[("user", user)])).send();
            r.await.unwrap().status().as_u16()
        }
    };
    assert_eq!(status("a").await, 200);
    assert_eq!(status("a").await, 429, "the old limit of 1 an hour holds");
}

/// Starts `sluice ARGS...` and waits until `addr` accepts connections.
fn sluice_listening(args: &[&str], addr: &str) -> Spawned {
    spawn_listening(env!("CARGO_BIN_EXE_sluice"), args, addr)
}

/// Two `sluice proxy` gateways on one Redis, in front of a real upstream, share one per-IP limit
/// exactly, and keep their counters under `--store-prefix`. The limit's window starts at the
/// first request: one aligned to the clock could end among the five requests, let a fourth
/// through and leave a second counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_redis_share_a_limit_under_their_prefix() {
    let redis = RedisServer::start();
    let (rules, _dir) = rules_file(
        "gateway.yaml",
        "domain: gw
descriptors:
  - key: client_ip
    rate_limit: {unit: hour, requests_per_unit: 3, alignment: first_request}
routes:
  - path: /api/*
    descriptors: [[{key: client_ip, from: client_ip}]]
",
    );
    let (upstream, a, b) = (free_addr(), free_addr(), free_addr());
    let _upstream = sluice_listening(&["bench", "upstream", "--listen", &upstream], &upstream);
    let prefix = unique_prefix();
    let upstream_url = format!("http://{upstream}");
    let gateway = |listen: &str| {
        let args = [
            "proxy",
            "--listen",
            listen,
            "--upstream",
            &upstream_url,
            "--store",
            &redis.url(),
            "--store-prefix",
            &prefix,
            "--store-timeout-ms",
            "5000",
            "--config",
            rules.to_str().unwrap(),
        ];
        sluice_listening(&args, listen)
    };
    let (_a, _b) = (gateway(&a), gateway(&b));
    let client = sluice_testing::long_lived_client();
    let mut answers = Vec::new();
    for addr in [&a, &b, &a, &b, &a] {
        let r = client
            .get(format!("http://{addr}/api/items"))
            .send()
            .await
            .unwrap();
        answers.push(r.status().as_u16());
    }
    assert_eq!(answers, [200, 200, 200, 429, 429]);
    let keys = redis
        .command(&["KEYS", &format!("{prefix}:*")])
        .unwrap_or_default();
    assert_eq!(
        keys.lines().count(),
        1,
        "one counter under the prefix: {keys}"
    );
    assert!(keys.contains("{gw|client_ip=127.0.0.1}"), "{keys}");
}

/// `SCRIPT FLUSH` and `FLUSHALL` while an instance is under load: every answer is a decision
/// (200 or 429), and not one request needed `on_store_error`: a flushed script is loaded again,
/// and flushed counters simply start afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_and_flushall_under_load_give_no_error_answers() {
    let redis = Arc::new(RedisServer::start());
    let (rules, _dir) = rules_file("rules.yaml", RULES);
    let instance = Instance::start(&rules, &redis.url(), &unique_prefix());
    // Flushes alternate for as long as the load runs.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let (redis, done) = (redis.clone(), done.clone());
        std::thread::spawn(move || {
            let mut flushes = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let command: &[&str] = if flushes % 2 == 0 {
                    &["SCRIPT", "FLUSH"]
                } else {
                    &["FLUSHALL"]
                };
                assert!(redis.command(command).is_some(), "{command:?}");
                flushes += 1;
            }
            flushes
        })
    };
    // `admitted` panics on any answer other than 200 or 429.
    let load = admitted(
        std::slice::from_ref(&instance.http),
        body(&[("token_bucket", "flush")]),
        3_000,
    )
    .await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let flushes = flusher.join().unwrap();
    assert!(flushes >= 10, "only {flushes} flushes overlapped the load");
    // FLUSHALL resets the counter: more than the limit of 50 got through in all.
    assert!(load > 50, "{load}");
    let metrics = reqwest::get(format!("{}/metrics", instance.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("sluice_store_errors_total 0"),
        "requests fell back to on_store_error:\n{metrics}"
    );
}
