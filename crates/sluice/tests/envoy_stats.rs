//! envoyproxy/ratelimit's statistics from the binary run as `ratelimit`: a statsd listener on
//! loopback receives the datagrams of a known sequence of `ShouldRateLimit` calls (within the
//! limit, near it, over it, in shadow mode, with `detailed_metric` and `value_to_metric`, an
//! address in a value, an invalid call), under Envoy's names, types and tags, each change sent
//! once; and the Prometheus listener shows the same under the names and labels of Envoy's
//! default statsd-exporter mapping, after Sluice's own series.

use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::path::Path;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice_test_support::{Listener, ServeProcess, free_addr};
use tonic::transport::Channel;

/// Envoy's format. Windows of a year aligned on the epoch, so that none ends during the test
/// (one that did would be named by [`one_window`]).
const RULES: &str = "domain: rl
descriptors:
  - key: generic_key
    value: slow
    rate_limit: {unit: year, requests_per_unit: 10}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: year, requests_per_unit: 1}
  - key: user
    detailed_metric: true
    rate_limit: {unit: year, requests_per_unit: 100}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: year, requests_per_unit: 100}
";

/// The largest datagram the service may send.
const MAX_DATAGRAM: usize = 1432;

fn request(entries: &[(&str, &str)], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "rl".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            ..Default::default()
        }],
        hits_addend: hits,
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    entries: &[(&str, &str)],
    hits: u32,
) -> RateLimitResponse {
    client
        .should_rate_limit(request(entries, hits))
        .await
        .unwrap()
        .into_inner()
}

/// Fails the test, saying why, if the answers' window was not one and the same: a later
/// answer's reset further away than an earlier one's.
fn one_window(answers: &[&RateLimitResponse]) {
    let resets: Vec<i64> = answers
        .iter()
        .map(|r| r.statuses[0].duration_until_reset.unwrap().seconds)
        .collect();
    assert!(
        resets.windows(2).all(|w| w[1] <= w[0]),
        "a year's window ended during the test: {resets:?}"
    );
}

/// What statsd received: the sum of each counter's changes, every response time's calls,
/// and every datagram's size.
#[derive(Debug, Default)]
struct Received {
    counters: BTreeMap<String, u64>,
    response_time_calls: u64,
    lines: Vec<String>,
}

impl Received {
    fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// Reads one datagram into the totals; every line must be `name:value|c` or
    /// `name:ms|ms`, with an optional sample rate on the latter.
    fn read(&mut self, datagram: &[u8]) {
        assert!(datagram.len() <= MAX_DATAGRAM, "{} bytes", datagram.len());
        let text = std::str::from_utf8(datagram).unwrap();
        assert!(text.ends_with('\n'), "{text:?}");
        for line in text.lines() {
            self.lines.push(line.to_owned());
            let (name, rest) = line.split_once(':').unwrap_or_else(|| panic!("{line}"));
            let parts: Vec<&str> = rest.split('|').collect();
            let value: u64 = parts[0].parse().unwrap_or_else(|_| panic!("{line}"));
            match parts[1..] {
                ["c"] => *self.counters.entry(name.to_owned()).or_default() += value,
                ["ms"] => self.response_time_calls += 1,
                ["ms", rate] => {
                    let rate: f64 = rate.strip_prefix('@').unwrap().parse().unwrap();
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    let calls = (1.0 / rate) as u64;
                    self.response_time_calls += calls;
                }
                _ => panic!("not a counter or a timer: {line}"),
            }
            if parts[1] == "ms" {
                assert_eq!(
                    name,
                    "ratelimit_server.ShouldRateLimit.response_time.__env=test"
                );
            }
        }
    }
}

/// Receives on `statsd` until `done` holds for what was received, or fails after a deadline
/// naming what came.
fn receive_until(statsd: &UdpSocket, received: &mut Received, done: impl Fn(&Received) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut buf = vec![0u8; 65536];
    while !done(received) {
        assert!(
            Instant::now() < deadline,
            "statsd never received the expected statistics; it received {received:#?}"
        );
        match statsd.recv(&mut buf) {
            Ok(n) => received.read(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => panic!("{e}"),
        }
    }
}

fn runtime_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("ratelimit").join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("config.yaml"), RULES).unwrap();
    root
}

fn ratelimit_symlink(dir: &Path) -> std::path::PathBuf {
    let link = dir.join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), &link).unwrap();
    link
}

fn port(addr: &str) -> &str {
    addr.rsplit_once(':').unwrap().1
}

/// A statistics name with the test's `EXTRA_TAGS`.
fn tagged(name: &str) -> String {
    format!("{name}.__env=test")
}

fn limit_stat(key: &str, stat: &str) -> String {
    tagged(&format!("ratelimit.service.rate_limit.{key}.{stat}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_statistics_reach_statsd_and_prometheus_under_envoys_names() {
    let statsd = UdpSocket::bind("127.0.0.1:0").unwrap();
    statsd
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let statsd_port = statsd.local_addr().unwrap().port().to_string();
    let root = runtime_root();
    let bin = tempfile::tempdir().unwrap();
    let program = ratelimit_symlink(bin.path());
    let (debug, prometheus) = (free_addr(), free_addr());
    let log = bin.path().join("output.log");
    let mut process = ServeProcess::ratelimit(&program)
        .envs([
            ("RUNTIME_ROOT", root.path().to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("DEBUG_HOST", "127.0.0.1"),
            ("DEBUG_PORT", port(&debug)),
            ("SLUICE_STORE", "memory"),
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "127.0.0.1"),
            ("STATSD_PORT", &statsd_port),
            ("STATS_FLUSH_INTERVAL", "50ms"),
            ("EXTRA_TAGS", "env:test"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", &prometheus),
            ("LOG_LEVEL", "info"),
        ])
        .log_to(&log)
        .ready_on(Listener::Grpc)
        .start();
    let (http, grpc) = (process.http().to_owned(), process.grpc().to_owned());
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();

    // A limit of 10, near it past 8: 7 hits within it, 2 more within it and one of them near
    // it, then 3 refused, 1 of them near and 2 over.
    let slow = [("generic_key", "slow")];
    let first = ask(&mut client, &slow, 7).await;
    let second = ask(&mut client, &slow, 2).await;
    let third = ask(&mut client, &slow, 3).await;
    one_window(&[&first, &second, &third]);
    assert_eq!(
        [&first, &second, &third].map(|r| r.overall_code),
        [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32]
    );
    // A shadow limit of 1: the second hit is over it, and passes.
    let shadow = [("shadow", "x")];
    assert_eq!(
        ask(&mut client, &shadow, 1).await.overall_code,
        Code::Ok as i32
    );
    assert_eq!(
        ask(&mut client, &shadow, 1).await.overall_code,
        Code::Ok as i32
    );
    // detailed_metric names the value, an address with its dots made `_`.
    ask(&mut client, &[("user", "alice")], 1).await;
    ask(&mut client, &[("user", "10.0.0.1")], 1).await;
    // value_to_metric on the key-only level names the request's value there only.
    ask(&mut client, &[("route", "api"), ("method", "GET")], 1).await;
    // A call without descriptors is refused: a service error.
    let refused = client
        .should_rate_limit(RateLimitRequest {
            domain: "rl".into(),
            ..Default::default()
        })
        .await;
    assert!(refused.is_err());
    // /json counts its limits too, though it is not a gRPC call.
    let json = reqwest::Client::new()
        .post(format!("http://{http}/json"))
        .body(r#"{"domain":"rl","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(json.status(), 200);

    let expected: Vec<(String, u64)> = [
        ("rl.generic_key_slow", "total_hits", 12),
        ("rl.generic_key_slow", "within_limit", 9),
        ("rl.generic_key_slow", "near_limit", 2),
        ("rl.generic_key_slow", "over_limit", 2),
        ("rl.shadow", "total_hits", 2),
        ("rl.shadow", "within_limit", 1),
        ("rl.shadow", "near_limit", 1),
        ("rl.shadow", "over_limit", 1),
        ("rl.shadow", "shadow_mode", 1),
        ("rl.user_alice", "total_hits", 1),
        ("rl.user_alice", "within_limit", 1),
        ("rl.user_10_0_0_1", "total_hits", 1),
        ("rl.user_10_0_0_1", "within_limit", 1),
        ("rl.user_bob", "total_hits", 1),
        ("rl.user_bob", "within_limit", 1),
        ("rl.route_api.method", "total_hits", 1),
        ("rl.route_api.method", "within_limit", 1),
    ]
    .into_iter()
    .map(|(key, stat, n)| (limit_stat(key, stat), n))
    .chain([
        (tagged("ratelimit_server.ShouldRateLimit.total_requests"), 9),
        (
            tagged("ratelimit.service.call.should_rate_limit.service_error"),
            1,
        ),
        (tagged("ratelimit.service.config_load_success"), 1),
    ])
    .collect();
    let mut received = Received::default();
    receive_until(&statsd, &mut received, |r| {
        r.response_time_calls >= 9 && expected.iter().all(|(name, n)| r.counter(name) >= *n)
    });
    for (name, n) in &expected {
        assert_eq!(received.counter(name), *n, "{name}: {received:#?}");
    }
    assert_eq!(received.response_time_calls, 9, "{received:#?}");
    // Nothing else: no statistic the sequence did not touch, such as a shadow_mode of a limit
    // that was never over in shadow mode.
    assert_eq!(
        received.counter(&limit_stat("rl.generic_key_slow", "shadow_mode")),
        0
    );
    let names: Vec<&String> = received.counters.keys().collect();
    assert_eq!(names.len(), expected.len(), "{names:#?}");

    // One more call: once statsd has it, the earlier changes were not sent again.
    ask(&mut client, &[("user", "alice")], 1).await;
    let requests = tagged("ratelimit_server.ShouldRateLimit.total_requests");
    receive_until(&statsd, &mut received, |r| {
        r.counter(&requests) == 10 && r.response_time_calls == 10
    });
    assert_eq!(
        received.counter(&limit_stat("rl.generic_key_slow", "total_hits")),
        12
    );
    assert_eq!(
        received.counter(&limit_stat("rl.user_alice", "total_hits")),
        2
    );

    // The Prometheus listener: Sluice's own series, then Envoy's under its mapping's names.
    let text = reqwest::get(format!("http://{prometheus}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("sluice_decisions_total{"), "{text}");
    assert!(
        text.ends_with("# EOF\n") && text.matches("# EOF").count() == 1,
        "{text}"
    );
    for line in [
        r#"ratelimit_service_rate_limit_total_hits{domain="rl",key1="generic_key_slow"} 12"#,
        r#"ratelimit_service_rate_limit_within_limit{domain="rl",key1="generic_key_slow"} 9"#,
        r#"ratelimit_service_rate_limit_near_limit{domain="rl",key1="generic_key_slow"} 2"#,
        r#"ratelimit_service_rate_limit_over_limit{domain="rl",key1="generic_key_slow"} 2"#,
        r#"ratelimit_service_rate_limit_shadow_mode{domain="rl",key1="shadow"} 1"#,
        r#"ratelimit_service_rate_limit_total_hits{domain="rl",key1="user_alice"} 2"#,
        r#"ratelimit_service_rate_limit_total_hits{domain="rl",key1="user_10_0_0_1"} 1"#,
        r#"ratelimit_service_rate_limit_total_hits{domain="rl",key1="route_api",key2="method"} 1"#,
        r#"ratelimit_service_should_rate_limit_error{err_type="service_error"} 1"#,
        r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 10"#,
        r#"ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"} 10"#,
        r#"ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="+Inf"} 10"#,
        "ratelimit_service_config_load_success 1",
        "# TYPE ratelimit_service_response_time_seconds histogram",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line} in {text}");
    }

    assert!(process.terminate().success());
    let output = std::fs::read_to_string(&log).unwrap();
    assert!(!output.contains("not honoured"), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_not_there_changes_no_answer() {
    // Nothing listens on the statsd port, and the flushes are as frequent as they can be.
    let nobody = UdpSocket::bind("127.0.0.1:0").unwrap();
    let statsd_port = nobody.local_addr().unwrap().port().to_string();
    drop(nobody);
    let root = runtime_root();
    let bin = tempfile::tempdir().unwrap();
    let program = ratelimit_symlink(bin.path());
    let debug = free_addr();
    let mut process = ServeProcess::ratelimit(&program)
        .envs([
            ("RUNTIME_ROOT", root.path().to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("DEBUG_HOST", "127.0.0.1"),
            ("DEBUG_PORT", port(&debug)),
            ("SLUICE_STORE", "memory"),
            ("STATSD_HOST", "127.0.0.1"),
            ("STATSD_PORT", &statsd_port),
            ("STATS_FLUSH_INTERVAL", "1ms"),
        ])
        .log_to(bin.path().join("output.log"))
        .ready_on(Listener::Grpc)
        .start();
    let mut client = RateLimitServiceClient::connect(format!("http://{}", process.grpc()))
        .await
        .unwrap();
    let slow = [("generic_key", "slow")];
    let mut codes = Vec::new();
    for _ in 0..11 {
        codes.push(ask(&mut client, &slow, 1).await.overall_code);
    }
    let mut expected = vec![Code::Ok as i32; 10];
    expected.push(Code::OverLimit as i32);
    assert_eq!(codes, expected);
    assert!(process.terminate().success());
}
