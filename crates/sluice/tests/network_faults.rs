//! Network faults between Sluice and Redis: a real `sluice serve` in a network namespace the
//! test makes, its Redis in another, the two joined by a veth pair, and faults made on that
//! link while clients send decisions: 5% of packets lost each way, a full partition for 3 s and
//! its healing, and a link that goes down and up every second; and 50 ms added each way.
//!
//! Each fault is held for a few seconds of load (16 clients, half on a rule with
//! `on_store_error: allow`, half on one with `deny`, both with limits no test reaches), and the
//! test asserts, from the answers it gets and what the process shows:
//!
//! - no answer but a decision: `allow`'s key answered 200 every time, `deny`'s 200 (Redis
//!   answered) or 429 (it did not, and the rule turned the request away); no 5xx, no
//!   transport error;
//! - the decisions' p99, measured by the test, stays within `--store-timeout-ms` (200 ms) plus
//!   [`P99_SLACK`] for the HTTP round trip of a debug build on a shared machine: a bound, not a
//!   speed target;
//! - under the partition, the store's circuit breaker opens (`/metrics`), and once the link
//!   heals it closes again, `/readyz` answers 200 and `deny`'s key is decided by Redis again;
//! - after every fault has healed, the process holds no more threads, file descriptors
//!   (`/proc/PID/fd`) or resident memory than after the warm-up, beyond [`MARGINS`].
//!
//! **How the faults are made.** The test's clients reach Sluice through a second veth pair,
//! from this namespace to Sluice's, which no fault touches. The faults are packet filters
//! (nftables) in Redis's namespace, on its end of the link, so no other namespace's firewall is
//! touched: loss is `numgen random mod 100 < 5 drop` in both directions, a partition drops
//! everything (connecting included). Debian's `tc netem` would make them as well, but this
//! machine's kernel (and CI's) is built without it (`CONFIG_NET_SCH_NETEM` not set: `tc qdisc
//! add … netem` answers "Specified qdisc kind is unknown"), and nothing else in the kernel
//! delays packets; the added latency is therefore a relay (`sluice_bench::serve_relay`, the one
//! the Cluster benchmark puts in front of each master) that holds every chunk 50 ms in each
//! direction before passing it on, between a `sluice serve` and a `redis-server` of its own on
//! this namespace's loopback.
//!
//! Creating a namespace needs root (CAP_NET_ADMIN). Without it the test says why on stderr and
//! passes without running; `./scripts/test` installs `ip` (iproute2) and `nft` (nftables) when
//! they are missing. The whole test takes about 25 s.

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice_redis::testing::RedisServer;
use sluice_test_support::{
    ServeBuilder, ServeProcess, Spawned, eventually_within, free_port, rules_file, wait_until,
};
use tokio::net::TcpListener;

/// Two rules with limits no test reaches: every answer other than "allowed" comes from
/// `on_store_error`.
const RULES: &str = "domain: faults
descriptors:
  - key: open
    on_store_error: allow
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: closed
    on_store_error: deny
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
";

/// `--store-timeout-ms`.
const STORE_TIMEOUT: Duration = Duration::from_millis(200);
/// What a decision may take beyond the store's timeout: the HTTP round trip on loopback and the
/// scheduling of a debug build on a loaded 2-core machine.
const P99_SLACK: Duration = Duration::from_millis(250);
/// Concurrent clients during a fault.
const CLIENTS: usize = 16;
/// Requests one client sends in one phase at most, whatever the time.
const MAX_PER_CLIENT: usize = 5_000;
/// How long a fault must be healed within: the breaker's cool-down is 500 ms, a reconnection
/// takes at most the store's 2 s connect timeout.
const RECOVERY: Duration = Duration::from_secs(20);

/// How much more the process may hold after every fault has healed than after the warm-up.
struct Margins {
    threads: usize,
    fds: usize,
    rss_kib: u64,
}

/// Threads: tokio's blocking pool keeps an idle thread 10 s. Descriptors: a connection or two
/// to Redis being replaced. Memory: allocator arenas and the store's buffers.
const MARGINS: Margins = Margins {
    threads: 4,
    fds: 8,
    rss_kib: 24 * 1024,
};

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} {args:?}: {e}; ./scripts/test installs it"))
}

fn run_ok(program: &str, args: &[&str]) {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two network namespaces the test makes: Sluice's, joined to this one by a veth pair (where
/// the test's clients reach it), and Redis's, joined to Sluice's by another, the link where
/// faults are made. Deleted (with the pairs) when dropped, panic or not.
struct Namespaces {
    /// Sluice's namespace.
    serve: String,
    /// Sluice's address on the pair to this namespace.
    serve_addr: String,
    /// This namespace's end of that pair.
    host_veth: String,
    /// Redis's namespace.
    redis: String,
    /// Redis's address on the pair to Sluice's namespace.
    redis_addr: String,
    /// Where faults are made.
    link: Filter,
}

/// The packet filter of Redis's end of the link.
#[derive(Debug, Clone)]
struct Filter {
    namespace: String,
    /// Redis's end of the pair.
    iface: String,
}

/// The state of the link, as Redis's namespace's packet filter makes it.
#[derive(Debug, Clone, Copy)]
enum Link {
    Healthy,
    /// This percentage of packets dropped, each way.
    Lossy(u8),
    Partitioned,
}

impl Namespaces {
    /// Creates both namespaces and both pairs, on two /30s of 198.18.0.0/15 (reserved for
    /// network tests, RFC 2544), named after this process; a table of its own in Redis's
    /// packet filter. `Err` says why this machine cannot.
    fn create() -> Result<Namespaces, String> {
        let pid = std::process::id();
        let (serve, redis) = (format!("sluice-serve-{pid}"), format!("sluice-redis-{pid}"));
        let out = run("ip", &["netns", "add", &serve]);
        if !out.status.success() {
            return Err(format!(
                "cannot create a network namespace (root with CAP_NET_ADMIN is needed): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        // Two /30s chosen by the process id, as the admin test chooses its own: two runs at
        // once share one only if their ids agree modulo 16,384 (or, with the admin test's, in
        // a rarer way), and the names, which hold the whole id, never clash. Only the first
        // is seen from this namespace.
        let block = (pid % 16_384) * 8;
        let base = format!("198.{}.{}", 18 + block / 65_536, (block / 256) % 256);
        let last = block % 256;
        let namespaces = Namespaces {
            serve_addr: format!("{base}.{}", last + 2),
            host_veth: format!("sfh{pid}"),
            redis_addr: format!("{base}.{}", last + 6),
            link: Filter {
                namespace: redis.clone(),
                iface: format!("sfr{pid}"),
            },
            serve,
            redis,
        };
        let (serve, redis) = (namespaces.serve.as_str(), namespaces.redis.as_str());
        run_ok("ip", &["netns", "add", redis]);
        for ns in [serve, redis] {
            run_ok("ip", &["-n", ns, "link", "set", "lo", "up"]);
        }
        // This namespace to Sluice's.
        let (host_veth, serve_veth) = (namespaces.host_veth.as_str(), format!("sfs{pid}"));
        run_ok(
            "ip",
            &[
                "link",
                "add",
                host_veth,
                "type",
                "veth",
                "peer",
                "name",
                &serve_veth,
                "netns",
                serve,
            ],
        );
        run_ok(
            "ip",
            &[
                "addr",
                "add",
                &format!("{base}.{}/30", last + 1),
                "dev",
                host_veth,
            ],
        );
        run_ok("ip", &["link", "set", host_veth, "up"]);
        let serve_cidr = format!("{}/30", namespaces.serve_addr);
        run_ok(
            "ip",
            &["-n", serve, "addr", "add", &serve_cidr, "dev", &serve_veth],
        );
        run_ok("ip", &["-n", serve, "link", "set", &serve_veth, "up"]);
        // Sluice's to Redis's: the link.
        let (to_redis, redis_veth) = (format!("sft{pid}"), namespaces.link.iface.as_str());
        run_ok(
            "ip",
            &[
                "-n", serve, "link", "add", &to_redis, "type", "veth", "peer", "name", redis_veth,
                "netns", redis,
            ],
        );
        let to_redis_cidr = format!("{base}.{}/30", last + 5);
        run_ok(
            "ip",
            &["-n", serve, "addr", "add", &to_redis_cidr, "dev", &to_redis],
        );
        run_ok("ip", &["-n", serve, "link", "set", &to_redis, "up"]);
        let redis_cidr = format!("{}/30", namespaces.redis_addr);
        run_ok(
            "ip",
            &["-n", redis, "addr", "add", &redis_cidr, "dev", redis_veth],
        );
        run_ok("ip", &["-n", redis, "link", "set", redis_veth, "up"]);
        namespaces
            .link
            .set(Link::Healthy)
            .map_err(|e| format!("cannot filter packets in a namespace (nftables): {e}"))?;
        Ok(namespaces)
    }

    /// `redis-server` in Redis's namespace, listening on its address, saving nothing, once it
    /// answers `PING` from Sluice's namespace.
    fn redis(&self) -> (Spawned, String) {
        let port = free_port().to_string();
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.redis, "redis-server"]);
        command.args(["--bind", &self.redis_addr, "--port", &port]);
        command.args(["--save", "", "--appendonly", "no", "--protected-mode", "no"]);
        command.stdout(Stdio::null()).stderr(Stdio::null());
        let redis = Spawned::spawn(&mut command);
        wait_until("redis-server answering from Sluice's namespace", || {
            let pong = run(
                "ip",
                &[
                    "netns",
                    "exec",
                    &self.serve,
                    "redis-cli",
                    "-h",
                    &self.redis_addr,
                    "-p",
                    &port,
                    "ping",
                ],
            );
            String::from_utf8_lossy(&pong.stdout).trim() == "PONG"
        });
        (redis, format!("{}:{port}", self.redis_addr))
    }

    /// `sluice serve` in Sluice's namespace, its HTTP listener on the address this namespace
    /// reaches, on `store`.
    fn serve(&self, rules: &std::path::Path, store: &str) -> ServeProcess {
        serve_builder(rules, store)
            .launched_by("ip", ["netns", "exec", &self.serve])
            .http_addr(format!("{}:{}", self.serve_addr, free_port()))
            .start()
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        // Deleting a namespace destroys its ends of the pairs, and with them the other ends;
        // this end is deleted too in case the namespace went first.
        let _ = run("ip", &["netns", "del", &self.redis]);
        let _ = run("ip", &["netns", "del", &self.serve]);
        let _ = run("ip", &["link", "del", &self.host_veth]);
    }
}

impl Filter {
    /// Makes the link `state`, at once and in both directions: the namespace's table is
    /// replaced in one transaction.
    fn set(&self, state: Link) -> Result<(), String> {
        let verdict = match state {
            Link::Healthy => "accept".to_owned(),
            Link::Lossy(percent) => format!("numgen random mod 100 < {percent} drop"),
            Link::Partitioned => "drop".to_owned(),
        };
        let iface = &self.iface;
        let ruleset = format!(
            "table inet sluice_faults\ndelete table inet sluice_faults\n\
             table inet sluice_faults {{\n\
               chain inbound {{ type filter hook input priority 0; iifname \"{iface}\" {verdict}; }}\n\
               chain outbound {{ type filter hook output priority 0; oifname \"{iface}\" {verdict}; }}\n\
             }}\n"
        );
        let mut nft = Command::new("ip")
            .args(["netns", "exec", &self.namespace, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("ip netns exec … nft: {e}"))?;
        nft.stdin
            .take()
            .expect("piped")
            .write_all(ruleset.as_bytes())
            .map_err(|e| e.to_string())?;
        let out = nft.wait_with_output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }

    fn must_set(&self, state: Link) {
        self.set(state)
            .unwrap_or_else(|e| panic!("setting the link {state:?}: {e}"));
    }
}

/// What the clients saw in one phase.
#[derive(Debug, Default)]
struct Answers {
    /// Each decision's time, in any order.
    latencies: Vec<Duration>,
    /// `allow`'s key, answered 200.
    open_allowed: usize,
    /// `deny`'s key, answered 200 (decided by Redis) or 429 (by `on_store_error`).
    closed_allowed: usize,
    closed_denied: usize,
    /// Anything else, quoted.
    errors: Vec<String>,
}

impl Answers {
    fn p99(&mut self) -> Duration {
        self.latencies.sort_unstable();
        let n = self.latencies.len();
        assert!(n > 0, "no answers");
        self.latencies[(n * 99).div_ceil(100) - 1]
    }

    fn merge(&mut self, other: Answers) {
        self.latencies.extend(other.latencies);
        self.open_allowed += other.open_allowed;
        self.closed_allowed += other.closed_allowed;
        self.closed_denied += other.closed_denied;
        self.errors.extend(other.errors);
    }
}

/// [`CLIENTS`] clients sending decisions to `http` for `duration` (at most
/// [`MAX_PER_CLIENT`] each), half on `allow`'s key, half on `deny`'s.
async fn load(client: &reqwest::Client, http: &str, duration: Duration) -> Answers {
    let url = format!("http://{http}/v1/check");
    let until = Instant::now() + duration;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let key = if i % 2 == 0 { "open" } else { "closed" };
                let body = format!(
                    r#"{{"domain":"faults","descriptors":[{{"entries":[{{"key":"{key}","value":"c{i}"}}]}}]}}"#
                );
                let mut answers = Answers::default();
                for _ in 0..MAX_PER_CLIENT {
                    if Instant::now() >= until {
                        break;
                    }
                    let sent = Instant::now();
                    let answer = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await;
                    let status = match answer {
                        Ok(answer) => {
                            let status = answer.status().as_u16();
                            // The whole answer is part of the decision's time.
                            let _ = answer.bytes().await;
                            status
                        }
                        Err(e) => {
                            answers.errors.push(format!("{key}: {e}"));
                            continue;
                        }
                    };
                    answers.latencies.push(sent.elapsed());
                    match (key, status) {
                        ("open", 200) => answers.open_allowed += 1,
                        ("closed", 200) => answers.closed_allowed += 1,
                        ("closed", 429) => answers.closed_denied += 1,
                        _ => answers.errors.push(format!("{key}: {status}")),
                    }
                }
                answers
            })
        })
        .collect();
    let mut all = Answers::default();
    for client in clients {
        all.merge(client.await.unwrap());
    }
    all
}

/// The answers of a phase are decisions only, as the rules' `on_store_error` says, and their
/// p99 is within the store's timeout and the slack. Returns the p99.
fn assert_decisions(phase: &str, answers: &mut Answers) -> Duration {
    assert!(
        answers.errors.is_empty(),
        "{phase}: {} answers were not decisions, e.g. {:?}",
        answers.errors.len(),
        &answers.errors[..answers.errors.len().min(5)]
    );
    let p99 = answers.p99();
    eprintln!(
        "{phase}: {} answers ({} allow-key allowed, deny-key {} allowed / {} denied), p99 {p99:?}",
        answers.latencies.len(),
        answers.open_allowed,
        answers.closed_allowed,
        answers.closed_denied
    );
    assert!(
        p99 <= STORE_TIMEOUT + P99_SLACK,
        "{phase}: decision p99 {p99:?}, beyond the store timeout {STORE_TIMEOUT:?} + {P99_SLACK:?}"
    );
    p99
}

async fn text(client: &reqwest::Client, url: String) -> (u16, String) {
    match client.get(&url).send().await {
        Ok(answer) => {
            let status = answer.status().as_u16();
            (status, answer.text().await.unwrap_or_default())
        }
        Err(e) => (0, e.to_string()),
    }
}

/// The breaker's state, from `/metrics`: `closed`, `open` or `half_open`.
async fn breaker(client: &reqwest::Client, http: &str) -> String {
    let (_, metrics) = text(client, format!("http://{http}/metrics")).await;
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("sluice_store_breaker_state{state=\""))
        .find_map(|l| l.strip_suffix("\"} 1"))
        .unwrap_or("absent")
        .to_owned()
}

/// The store's calls failed in all and, of them, those the open breaker failed at once, from
/// `/metrics`: printed with each phase, for the figures in `docs/hardening.md`.
async fn store_failures(client: &reqwest::Client, http: &str) -> (u64, u64) {
    let (_, metrics) = text(client, format!("http://{http}/metrics")).await;
    let value = |name: &str| {
        metrics
            .lines()
            .filter_map(|l| l.strip_prefix(name))
            .filter_map(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    (
        value("sluice_store_errors_total"),
        value("sluice_store_short_circuited_total"),
    )
}

fn report_failures(phase: &str, before: (u64, u64), after: (u64, u64)) {
    eprintln!(
        "{phase}: {} store calls failed, {} of them at once by the open breaker",
        after.0 - before.0,
        after.1 - before.1
    );
}

/// Waits until the store is healthy again: the breaker closed, `/readyz` 200, and `deny`'s key
/// decided by Redis (200).
async fn recovered(client: &reqwest::Client, http: &str, phase: &str) -> Duration {
    let started = Instant::now();
    let check = format!("http://{http}/v1/check");
    let body =
        r#"{"domain":"faults","descriptors":[{"entries":[{"key":"closed","value":"probe"}]}]}"#;
    eventually_within(
        &format!("{phase}: the store healthy again (breaker closed, /readyz 200, Redis deciding)"),
        RECOVERY,
        || async {
            let decided = client
                .post(&check)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .is_ok_and(|a| a.status().as_u16() == 200);
            let ready = text(client, format!("http://{http}/readyz")).await.0 == 200;
            decided && ready && breaker(client, http).await == "closed"
        },
    )
    .await;
    started.elapsed()
}

/// What the process holds: threads, open descriptors, resident KiB.
#[derive(Debug, Clone, Copy)]
struct Held {
    threads: usize,
    fds: usize,
    rss_kib: u64,
}

fn held(pid: u32) -> Held {
    let count = |dir: &str| {
        std::fs::read_dir(format!("/proc/{pid}/{dir}"))
            .unwrap_or_else(|e| panic!("/proc/{pid}/{dir}: {e}"))
            .count()
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status");
    Held {
        threads: count("task"),
        fds: count("fd"),
        rss_kib,
    }
}

/// `sluice serve` on `store`, its store calls bounded by [`STORE_TIMEOUT`].
fn serve_builder(rules: &std::path::Path, store: &str) -> ServeBuilder {
    let timeout = STORE_TIMEOUT.as_millis().to_string();
    ServeProcess::builder(env!("CARGO_BIN_EXE_sluice"))
        .config(rules)
        .args(["--store", store, "--store-timeout-ms", &timeout])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_stay_bounded_and_recover_through_network_faults_to_redis() {
    let namespaces = match Namespaces::create() {
        Ok(namespaces) => namespaces,
        Err(why) => {
            eprintln!("network_faults: skipped: {why}");
            return;
        }
    };
    let (rules, _dir) = rules_file("rules.yaml", RULES);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();

    // Added latency, through the relay, on this namespace's loopback: every call crosses it
    // twice, 100 ms in all, within the store's timeout, so every answer is Redis's decision.
    let local_redis = RedisServer::start();
    let upstream: SocketAddr = local_redis
        .url()
        .trim_start_matches("redis://")
        .parse()
        .expect("Redis listens on an IP address");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay = sluice_bench::serve_relay(listener, upstream, Duration::from_millis(50)).unwrap();
    let delayed = serve_builder(&rules, &format!("redis://{}", relay.addr())).start();
    // The first calls load the scripts (a second round trip), which the latency can push past
    // the timeout: the load begins once Redis decides.
    recovered(&client, delayed.http(), "50 ms each way, before the load").await;
    let mut answers = load(&client, delayed.http(), Duration::from_secs(3)).await;
    assert_decisions("50 ms each way", &mut answers);
    assert_eq!(
        answers.closed_denied, 0,
        "50 ms each way: the deny rule turned requests away, so store calls failed"
    );
    assert_eq!(breaker(&client, delayed.http()).await, "closed");
    drop((delayed, local_redis));

    // The other faults, on the link between the namespaces.
    let (_redis, redis_addr) = namespaces.redis();
    let sluice = namespaces.serve(&rules, &format!("redis://{redis_addr}"));
    let http = sluice.http();
    let mut warm = load(&client, http, Duration::from_secs(2)).await;
    assert_decisions("warm-up", &mut warm);
    assert_eq!(warm.closed_denied, 0, "warm-up: store calls failed");
    let before = held(sluice.pid());

    // 5% of packets lost each way: TCP resends them, and a call whose packet waits out the
    // retransmission timeout (200 ms at least) fails at the store's timeout.
    let failed_before = store_failures(&client, http).await;
    namespaces.link.must_set(Link::Lossy(5));
    let mut answers = load(&client, http, Duration::from_secs(4)).await;
    namespaces.link.must_set(Link::Healthy);
    assert_decisions("5% loss", &mut answers);
    report_failures(
        "5% loss",
        failed_before,
        store_failures(&client, http).await,
    );
    let took = recovered(&client, http, "5% loss").await;
    eprintln!("5% loss: healthy again {took:?} after the link healed");

    // A partition for 3 s: the breaker opens (calls then fail at once), and closes once the
    // link heals.
    let failed_before = store_failures(&client, http).await;
    namespaces.link.must_set(Link::Partitioned);
    let opened = Arc::new(AtomicBool::new(false));
    let watching = {
        let (client, http, opened) = (client.clone(), http.to_owned(), opened.clone());
        tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until && !opened.load(Ordering::Relaxed) {
                let state = breaker(&client, &http).await;
                if state == "open" || state == "half_open" {
                    opened.store(true, Ordering::Relaxed);
                }
            }
        })
    };
    let mut answers = load(&client, http, Duration::from_secs(3)).await;
    watching.await.unwrap();
    namespaces.link.must_set(Link::Healthy);
    assert_decisions("partition", &mut answers);
    report_failures(
        "partition",
        failed_before,
        store_failures(&client, http).await,
    );
    assert!(
        opened.load(Ordering::Relaxed),
        "partition: the breaker never opened"
    );
    assert!(
        answers.closed_denied > 0,
        "partition: the deny rule never applied"
    );
    let took = recovered(&client, http, "partition").await;
    eprintln!("partition: healthy again {took:?} after the link healed");

    // The link down and up every second, for 6 s.
    let failed_before = store_failures(&client, http).await;
    let flapping = {
        let flapper = namespaces.link.clone();
        std::thread::spawn(move || {
            for i in 0..6 {
                let state = if i % 2 == 0 {
                    Link::Partitioned
                } else {
                    Link::Healthy
                };
                flapper.must_set(state);
                // A timed phase of the fault, not a wait for anything.
                std::thread::sleep(Duration::from_secs(1));
            }
            flapper.must_set(Link::Healthy);
        })
    };
    let mut answers = load(&client, http, Duration::from_secs(6)).await;
    flapping.join().unwrap();
    assert_decisions("flapping", &mut answers);
    report_failures(
        "flapping",
        failed_before,
        store_failures(&client, http).await,
    );
    let took = recovered(&client, http, "flapping").await;
    eprintln!("flapping: healthy again {took:?} after the link healed");

    // Nothing kept from the faults: the same load as the warm-up, then what the process holds.
    let mut after_load = load(&client, http, Duration::from_secs(2)).await;
    assert_decisions("after the faults", &mut after_load);
    assert_eq!(
        after_load.closed_denied, 0,
        "after the faults: store calls failed"
    );
    let after = held(sluice.pid());
    eprintln!("held after the warm-up {before:?}, after the faults {after:?}");
    assert!(
        after.threads <= before.threads + MARGINS.threads,
        "threads grew: {before:?} to {after:?}"
    );
    assert!(
        after.fds <= before.fds + MARGINS.fds,
        "file descriptors grew: {before:?} to {after:?}"
    );
    assert!(
        after.rss_kib <= before.rss_kib + MARGINS.rss_kib,
        "resident memory grew: {before:?} to {after:?}"
    );
}
