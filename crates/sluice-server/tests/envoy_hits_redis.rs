//! Envoy's token-quota flow (check with a per-descriptor hits_addend of 0, then report the
//! usage) on the Redis store, standalone and Cluster: the usage reported past a limit is kept
//! on a second counter of the same window, in the same slot, so every instance sees it. And
//! envoyproxy/ratelimit's multi-service token quota, its checks on one instance and its
//! reports on another: while one service's quota is over, requests go to the other; a check
//! with 0 on a counter that holds nothing yet reports the rest of the day, on Redis's clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, rate_limit_response::Code};
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice_redis::testing::{shared_cluster, shared_server, unique_prefix};
use sluice_server::{ServeOptions, Server};
use sluice_test_support::rules_file;
use sluice_test_support::window::{LatestWindow, clock_window};
use tonic::transport::Channel;

/// What the flow checks on one counter: the hits reported, the descriptor's code, and what
/// remains.
type Seen = (u64, i32, u32);

// Envoy's `unit: day`, aligned to the clock (Redis keeps the time here): a day can still end
// while the test runs, at midnight UTC. The flow then runs again on another counter, in the
// new day.
const RULES: &str = "domain: ai\ndescriptors:\n  - key: tokens\n    rate_limit: {unit: day, requests_per_unit: 100}\n";

async fn flow(store: String) {
    let (rules, _dir) = rules_file("rules.yaml", RULES);
    let start = |prefix: String| {
        let mut options = ServeOptions::new(vec![rules.clone()]);
        options.http_addr = "127.0.0.1:0".parse().unwrap();
        options.grpc_addr = "127.0.0.1:0".parse().unwrap();
        options.store = store.clone();
        options.store_settings.prefix = prefix;
        Server::start(options)
    };
    // Two instances on one store: one reports, the other checks.
    let prefix = unique_prefix();
    let a = start(prefix.clone()).await.unwrap();
    let b = start(prefix).await.unwrap();
    let connect = |s: &Server| RateLimitServiceClient::connect(format!("http://{}", s.grpc_addr()));
    let (mut a_client, mut b_client) = (connect(&a).await.unwrap(), connect(&b).await.unwrap());
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    let mut seen = flow_on(&mut a_client, &mut b_client, "team-1").await;
    if seen.windows() > 1 {
        // A day ended during the flow, and its counter started afresh in the middle of it.
        seen = flow_on(&mut a_client, &mut b_client, "team-2").await;
        assert_eq!(seen.windows(), 1, "a second day ended within the test");
    }
    assert_eq!(
        seen.answers(),
        [
            (0, ok, 100),
            (70, ok, 30),
            (30, ok, 0),
            (0, ok, 0),
            (45, over, 0),
            (0, over, 0),
        ]
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// The flow on `team`'s counter: checks with no hits from `b`, usage reported to `a`. Returns
/// what each step saw, and in how many days.
async fn flow_on(
    a_client: &mut RateLimitServiceClient<Channel>,
    b_client: &mut RateLimitServiceClient<Channel>,
    team: &str,
) -> LatestWindow<Seen> {
    let hits = |n: u64| RateLimitRequest {
        domain: "ai".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "tokens".into(),
                value: team.into(),
            }],
            hits_addend: Some(UInt64Value { value: n }),
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let mut seen = LatestWindow::new();
    for (n, on_a) in [
        (0, false),
        (70, true),
        (30, true),
        (0, false),
        (45, true),
        (0, false),
    ] {
        let client = if on_a { &mut *a_client } else { &mut *b_client };
        let r = client
            .should_rate_limit(hits(n))
            .await
            .unwrap()
            .into_inner();
        let status = &r.statuses[0];
        let until = status
            .duration_until_reset
            .expect("a reset for a limited descriptor");
        let until = Duration::new(
            u64::try_from(until.seconds).unwrap(),
            u32::try_from(until.nanos).unwrap(),
        );
        seen.push((n, status.code, status.limit_remaining), until);
    }
    seen
}

#[tokio::test]
async fn the_token_quota_flow_holds_on_a_redis_server() {
    flow(shared_server().url()).await;
}

#[tokio::test]
async fn the_token_quota_flow_holds_on_a_redis_cluster() {
    flow(shared_cluster().url()).await;
}

/// Two services' token quotas, as envoyproxy/ratelimit's multi-service example gives them (one
/// a day and two a day here, so that no window ends within the test but at midnight UTC): each
/// value of the key is a counter of its own.
const SERVICES: &str = "domain: ai
descriptors:
  - key: gold
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
    metadata: {service: gold}
  - key: silver
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 2}
    metadata: {service: silver}
";

const DAY: Duration = Duration::from_secs(86_400);

async fn multi_service(store: String) {
    let (rules, _dir) = rules_file("rules.yaml", SERVICES);
    let start = |prefix: String| {
        let mut options = ServeOptions::new(vec![rules.clone()]);
        options.http_addr = "127.0.0.1:0".parse().unwrap();
        options.grpc_addr = "127.0.0.1:0".parse().unwrap();
        options.store = store.clone();
        options.store_settings.prefix = prefix;
        options.envoy.dynamic_metadata = true;
        Server::start(options)
    };
    // Checks go to one instance, reports to the other.
    let prefix = unique_prefix();
    let a = start(prefix.clone()).await.unwrap();
    let b = start(prefix).await.unwrap();
    let connect = |s: &Server| RateLimitServiceClient::connect(format!("http://{}", s.grpc_addr()));
    let (mut checks, mut reports) = (connect(&a).await.unwrap(), connect(&b).await.unwrap());
    for team in ["team-1", "team-2"] {
        let day = clock_window(DAY);
        let served = route_six(&mut checks, &mut reports, team).await;
        if clock_window(DAY) != day {
            // Midnight UTC passed during the flow: once more, on other counters.
            assert_eq!(team, "team-1", "a second day ended within the test");
            continue;
        }
        assert_eq!(
            served,
            ["gold", "gold", "silver", "silver", "silver", "refused"],
            "{team}"
        );
        break;
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// Six requests for `team` through Envoy as the example routes them: both quotas checked with
/// 0 on `checks`, the request sent to the service the answer's metadata names, and its usage
/// reported with 1 on `reports`. Which service served each, or `refused`. The first check, on
/// counters that hold nothing yet, reports the rest of the day for both.
async fn route_six(
    checks: &mut RateLimitServiceClient<Channel>,
    reports: &mut RateLimitServiceClient<Channel>,
    team: &str,
) -> Vec<String> {
    let ask = |services: &[(&str, u64)]| RateLimitRequest {
        domain: "ai".into(),
        descriptors: services
            .iter()
            .map(|(service, n)| RateLimitDescriptor {
                entries: vec![Entry {
                    key: (*service).into(),
                    value: team.into(),
                }],
                hits_addend: Some(UInt64Value { value: *n }),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    };
    let mut served = Vec::new();
    for step in 0..6 {
        let before = rest_of_day();
        let r = checks
            .should_rate_limit(ask(&[("gold", 0), ("silver", 0)]))
            .await
            .unwrap()
            .into_inner();
        let after = rest_of_day();
        if step == 0 && after <= before {
            for s in &r.statuses {
                let reset = s.duration_until_reset.expect("a reset").seconds;
                let reset = u64::try_from(reset).unwrap();
                assert!(
                    after.as_secs() <= reset && reset <= before.as_secs() + 1,
                    "{reset} s, the rest of the day being {after:?} to {before:?}"
                );
            }
        }
        if r.overall_code != Code::Ok as i32 {
            served.push("refused".to_owned());
            continue;
        }
        let metadata =
            sluice_server::metadata::struct_json(r.dynamic_metadata.as_ref().expect("metadata"));
        let service = metadata["metadata"]["service"].as_str().unwrap().to_owned();
        reports
            .should_rate_limit(ask(&[(service.as_str(), 1)]))
            .await
            .unwrap();
        served.push(service);
    }
    served
}

/// How long this machine's clock (which `redis-server` reads too) has until midnight UTC.
fn rest_of_day() -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970");
    DAY - Duration::from_nanos(u64::try_from(now.as_nanos() % DAY.as_nanos()).unwrap())
}

#[tokio::test]
async fn the_multi_service_token_quota_holds_on_a_redis_server() {
    multi_service(shared_server().url()).await;
}

#[tokio::test]
async fn the_multi_service_token_quota_holds_on_a_redis_cluster() {
    multi_service(shared_cluster().url()).await;
}
