//! `sluice bench` against real servers on loopback: the service (memory store on a fake clock,
//! so every count is exact), the trivial upstream, and a port nobody listens on. Runs are
//! bounded by a number of requests, never by the clock.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use sluice_bench::{self as bench, BenchError, GrpcTarget, HttpTarget, Load, Version};
use sluice_core::{FakeClock, MemoryStore, Timestamp};
use sluice_server::{ServeOptions, Server};

const RULES: &str = r#"
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
"#;

async fn service() -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let mut options = ServeOptions::new(vec![rules]);
    options.http_addr = "127.0.0.1:0".parse().unwrap();
    options.grpc_addr = "127.0.0.1:0".parse().unwrap();
    // Midnight UTC: no window ends during the test.
    let clock = FakeClock::at(Timestamp::from_secs(20_000 * 86_400));
    let store = Arc::new(MemoryStore::builder().clock(clock).build());
    (Server::start_with_store(options, store).await.unwrap(), dir)
}

/// `requests` in all over `keys` keys, closed loop.
fn counted(requests: u64, keys: u64, concurrency: usize) -> Load {
    Load {
        concurrency,
        duration: None,
        requests: Some(requests),
        keys,
        ..Load::default()
    }
}

fn json_body() -> Option<String> {
    Some(r#"{"domain":"bench","descriptors":[{"entries":[{"key":"user","value":"u{n}"}]}]}"#.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_counts_every_answer_exactly() {
    let (server, _dir) = service().await;
    let url = format!("http://{}/json", server.http_addr());
    let target = HttpTarget::new(&url, Method::POST, &[], json_body(), Version::Http1, 5).unwrap();
    let report = bench::run_http(target, counted(100, 5, 8)).await.unwrap();
    // 5 users of 20 requests each; each user gets its 10.
    assert_eq!(report.requests, 100);
    assert_eq!(
        (report.allowed, report.limited, report.error_count()),
        (50, 50, 0)
    );
    assert_eq!(report.measured, 100);
    assert!(report.latency.p50_us > 0.0 && report.latency.p50_us <= report.latency.p99_us);
    assert!(report.latency.p99_us <= report.latency.max_us);
    assert!(report.throughput > 0.0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_multiplexes_workers_and_counts_exactly() {
    let (server, _dir) = service().await;
    let url = format!("http://{}/json", server.http_addr());
    let version = Version::H2 { connections: 2 };
    let target = HttpTarget::new(&url, Method::POST, &[], json_body(), version, 3).unwrap();
    let report = bench::run_http(target, counted(60, 3, 16)).await.unwrap();
    assert_eq!(
        (report.allowed, report.limited, report.error_count()),
        (30, 30, 0)
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_counts_every_answer_exactly() {
    let (server, _dir) = service().await;
    let target = GrpcTarget::new(
        &server.grpc_addr().to_string(),
        "bench".into(),
        &["user=g{n}".into()],
        0,
        2,
    )
    .unwrap();
    let report = bench::run_grpc(target, counted(70, 7, 16)).await.unwrap();
    assert_eq!(
        (report.allowed, report.limited, report.error_count()),
        (70, 0, 0)
    );
    // Hits of 4 against a limit of 10: two admitted per key, then over the limit.
    let target = GrpcTarget::new(
        &server.grpc_addr().to_string(),
        "bench".into(),
        &["user=h{n}".into()],
        4,
        1,
    )
    .unwrap();
    let report = bench::run_grpc(target, counted(12, 3, 1)).await.unwrap();
    assert_eq!((report.allowed, report.limited), (6, 6));
    // A call the service refuses is an error named by its gRPC code, not an answer.
    let long = format!("user={}", "x".repeat(2_000));
    let target = GrpcTarget::new(
        &server.grpc_addr().to_string(),
        "bench".into(),
        &[long],
        0,
        1,
    )
    .unwrap();
    let report = bench::run_grpc(target, counted(5, 5, 1)).await.unwrap();
    assert_eq!(
        (report.allowed, report.limited, report.error_count()),
        (0, 0, 5)
    );
    assert_eq!(
        report.errors.get("gRPC InvalidArgument"),
        Some(&5),
        "{:?}",
        report.errors
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_sends_exactly_what_it_is_asked_and_measures_after_the_warm_up() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = bench::serve_trivial_upstream(listener).unwrap();
    let url = format!("http://{}/anything/{{n}}", upstream.addr());
    let target = HttpTarget::new(&url, Method::GET, &[], None, Version::Http1, 1).unwrap();
    let load = Load {
        rate: Some(20_000.0),
        concurrency: 4,
        duration: None,
        requests: Some(200),
        // The first 100 requests are due in the first 5 ms.
        warmup: Duration::from_millis(5),
        ..Load::default()
    };
    let report = bench::run_http(target, load).await.unwrap();
    assert_eq!((report.requests, report.allowed), (200, 200));
    assert_eq!(
        report.measured, 100,
        "requests due in the warm-up are not measured"
    );
    upstream.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_statuses_are_counted_by_name() {
    let (server, _dir) = service().await;
    let url = format!("http://{}/no/such/path", server.http_addr());
    let target = HttpTarget::new(&url, Method::GET, &[], None, Version::Http1, 1).unwrap();
    let report = bench::run_http(target, counted(9, 1, 3)).await.unwrap();
    assert_eq!(report.errors.get("HTTP 404"), Some(&9), "{report}");
    assert_eq!(report.allowed + report.limited, 0);
    // A value longer than the service takes: refused with a status, and only a status (the
    // answer's headers carry it, there is no message).
    let long = format!("user={}", "x".repeat(1025));
    let grpc = GrpcTarget::new(&server.grpc_addr().to_string(), "d".into(), &[long], 1, 2).unwrap();
    let report = bench::run_grpc(grpc, counted(7, 1, 3)).await.unwrap();
    assert_eq!(
        report.errors.get("gRPC InvalidArgument"),
        Some(&7),
        "{report}"
    );
    assert_eq!(report.allowed + report.limited, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_target_is_named() {
    // Bind and drop a listener, so the port is free and nothing listens on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/");
    let target = HttpTarget::new(&url, Method::GET, &[], None, Version::Http1, 1).unwrap();
    match bench::run_http(target, counted(1, 1, 1)).await {
        Err(e @ BenchError::Connect { .. }) => assert!(e.to_string().contains(&url), "{e}"),
        other => panic!("expected a connect error, got {other:?}"),
    }
    let grpc = GrpcTarget::new(
        &format!("127.0.0.1:{port}"),
        "d".into(),
        &["a=b".into()],
        0,
        1,
    );
    match bench::run_grpc(grpc.unwrap(), counted(1, 1, 1)).await {
        Err(e @ BenchError::Connect { .. }) => {
            assert!(e.to_string().contains(&port.to_string()), "{e}")
        }
        other => panic!("expected a connect error, got {other:?}"),
    }
}

const BUDGET: u64 = 10_000;

const USAGE_RULES: &str = r#"
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 10000, algorithm: fixed_window}
"#;

/// Usage calls of 50 to 500 units (500 declared) by 40 callers against a budget of 10,000 an
/// hour, more calls than the budget holds, so every run ends refused.
async fn usage_run(server: &Server, flow: bench::Flow, tenant: &str) -> bench::UsageReport {
    let usage = bench::Usage {
        flow,
        declared: 500,
        used_min: 50,
        used_max: 500,
        seed: 3,
        ttl: Some("2m".into()),
        budget: Some(BUDGET),
    };
    let target = bench::UsageTarget::new(
        &[format!("http://{}", server.http_addr())],
        "llm",
        &[format!("tenant={tenant}")],
        usage,
    )
    .unwrap();
    bench::run_usage(target, counted(150, 1, 40)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_calls_stay_within_the_budget_with_reservations_and_add_up() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, USAGE_RULES).unwrap();
    let mut options = ServeOptions::new(vec![rules]);
    options.http_addr = "127.0.0.1:0".parse().unwrap();
    options.grpc_addr = "127.0.0.1:0".parse().unwrap();
    // Midnight UTC on a clock that stands still: the hour's window holds the whole run.
    let clock = FakeClock::at(Timestamp::from_secs(20_000 * 86_400));
    let store = Arc::new(MemoryStore::builder().clock(clock).build());
    let server = Server::start_with_store(options, store).await.unwrap();

    let r = usage_run(&server, bench::Flow::Reserve, "reserve").await;
    assert_eq!(r.run.error_count(), 0, "{r}");
    assert_eq!((r.run.requests, r.calls_admitted), (150, r.run.allowed));
    assert!(
        r.run.limited > 0,
        "150 calls of 50 or more exhaust 10,000: {r}"
    );
    assert!(r.tokens_used <= BUDGET, "reservations never overspend: {r}");
    assert_eq!(r.beyond_budget, Some(0));
    assert!(r.tokens_used >= r.calls_admitted * 50 && r.tokens_used <= r.calls_admitted * 500);
    assert_eq!(r.tokens_reserved, r.calls_admitted * 500);
    // Every unit reserved and not used came back, and nothing was charged past a reservation.
    assert_eq!(r.refunded, r.refunds_expected, "{r}");
    assert_eq!(r.refunds_expected, r.tokens_reserved - r.tokens_used);
    assert_eq!(r.charged, 0);

    let r = usage_run(&server, bench::Flow::Report, "report").await;
    assert_eq!(r.run.error_count(), 0, "{r}");
    assert_eq!((r.run.requests, r.calls_admitted), (150, r.run.allowed));
    assert!(r.run.limited > 0, "{r}");
    // A check is refused only once the reports reached the budget, so the admitted calls
    // spent at least all of it; how far beyond depends on how many checks were in flight.
    assert!(r.tokens_used >= BUDGET, "{r}");
    assert_eq!(r.beyond_budget, Some(r.tokens_used - BUDGET));
    assert!(r.tokens_used >= r.calls_admitted * 50 && r.tokens_used <= r.calls_admitted * 500);
    assert_eq!((r.tokens_reserved, r.refunded, r.charged), (0, 0, 0));
    let shown = r.to_string();
    assert!(
        shown.contains("check-then-report") && shown.contains("beyond it"),
        "{shown}"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["flow"], "report");
    assert_eq!(json["allowed"], json["calls_admitted"]);
    server.shutdown().await;
}
