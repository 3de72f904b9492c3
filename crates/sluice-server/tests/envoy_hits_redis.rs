//! Envoy's token-quota flow (check with a per-descriptor hits_addend of 0, then report the
//! usage) on the Redis store, standalone and Cluster: the usage reported past a limit is kept
//! on a second counter of the same window, in the same slot, so every instance sees it.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, rate_limit_response::Code};
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice_redis::testing::{shared_cluster, shared_server, unique_prefix};
use sluice_server::{ServeOptions, Server};

// A day's window, so that no window ends while the test runs (Redis keeps the time here).
const RULES: &str = "domain: ai\ndescriptors:\n  - key: tokens\n    rate_limit: {unit: day, requests_per_unit: 100}\n";

async fn flow(store: String) {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
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
    let hits = |n: u64| RateLimitRequest {
        domain: "ai".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "tokens".into(),
                value: "team-1".into(),
            }],
            hits_addend: Some(UInt64Value { value: n }),
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    let mut seen = Vec::new();
    for (n, on_a) in [
        (0, false),
        (70, true),
        (30, true),
        (0, false),
        (45, true),
        (0, false),
    ] {
        let client = if on_a { &mut a_client } else { &mut b_client };
        let r = client
            .should_rate_limit(hits(n))
            .await
            .unwrap()
            .into_inner();
        seen.push((n, r.statuses[0].code, r.statuses[0].limit_remaining));
    }
    assert_eq!(
        seen,
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

#[tokio::test]
async fn the_token_quota_flow_holds_on_a_redis_server() {
    flow(shared_server().url()).await;
}

#[tokio::test]
async fn the_token_quota_flow_holds_on_a_redis_cluster() {
    flow(shared_cluster().url()).await;
}
