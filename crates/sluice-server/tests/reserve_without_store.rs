//! `/v1/reserve` and gRPC `Reserve` while the store is away: with `on_store_error: allow` the
//! request is admitted and holds no reservation, and the answer says so
//! (`admitted_without_store`), beside the `null` (or empty) reservation; with `deny` it is
//! refused, and does not say it.

use std::sync::Arc;

use serde_json::{Value, json};
use sluice_core::{Check, Decision, Lease, Policy, Store, StoreError, StoreResult};
use sluice_server::sluice_v1::reservations_client::ReservationsClient;
use sluice_server::sluice_v1::{Descriptor, Entry, ReserveRequest, ReserveResponse};
use sluice_server::{ServeOptions, Server};
use sluice_test_support::rules_file;

/// A store that is away: every call fails as a transient outage does.
struct Away;

fn away<T>() -> StoreResult<T> {
    Err(StoreError::Unavailable("away".into()))
}

impl Store for Away {
    async fn check(&self, _checks: &[Check<'_>]) -> StoreResult<Vec<Decision>> {
        away()
    }

    async fn peek(&self, _key: &str, _policy: &Policy) -> StoreResult<Decision> {
        away()
    }

    async fn reset(&self, _key: &str) -> StoreResult<bool> {
        away()
    }

    async fn reserve(
        &self,
        _checks: &[Check<'_>],
        _lease: Lease<'_>,
    ) -> StoreResult<Vec<Decision>> {
        away()
    }
}

/// The same reservation over HTTP (its status and body) and over gRPC, on a server whose rule
/// says `on_store_error`.
async fn reserve(on_store_error: &str) -> (u16, Value, ReserveResponse) {
    let rules = format!(
        "domain: llm\non_store_error: {on_store_error}\ndescriptors:\n  - key: tenant\n    \
         rate_limit: {{unit: hour, requests_per_unit: 1000}}\n"
    );
    let (path, _dir) = rules_file("rules.yaml", &rules);
    let mut options = ServeOptions::new(vec![path]);
    options.http_addr = "127.0.0.1:0".parse().unwrap();
    options.grpc_addr = "127.0.0.1:0".parse().unwrap();
    let server = Server::start_with_store(options, Arc::new(Away))
        .await
        .unwrap();
    let body = json!({"domain": "llm", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}],
                      "amount": 100});
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/reserve", server.http_addr()))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let answer = r.json().await.unwrap();
    let mut grpc = ReservationsClient::connect(format!("http://{}", server.grpc_addr()))
        .await
        .unwrap();
    let over_grpc = grpc
        .reserve(ReserveRequest {
            domain: "llm".into(),
            descriptors: vec![Descriptor {
                entries: vec![Entry {
                    key: "tenant".into(),
                    value: "acme".into(),
                }],
            }],
            amount: 100,
            ttl: None,
        })
        .await
        .unwrap()
        .into_inner();
    drop(grpc);
    server.shutdown().await;
    (status, answer, over_grpc)
}

#[tokio::test]
async fn admitted_without_the_store_says_so() {
    let (status, r, over_grpc) = reserve("allow").await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["reservation"], Value::Null, "{r}");
    assert_eq!(r["admitted_without_store"], json!(true), "{r}");
    assert!(over_grpc.allowed, "{over_grpc:?}");
    assert_eq!(over_grpc.reservation, "", "{over_grpc:?}");
    assert!(over_grpc.admitted_without_store, "{over_grpc:?}");
}

#[tokio::test]
async fn refused_without_the_store_when_the_rule_denies() {
    let (status, r, over_grpc) = reserve("deny").await;
    assert_eq!(status, 429, "{r}");
    assert_eq!(r["reservation"], Value::Null, "{r}");
    assert!(r.get("admitted_without_store").is_none(), "{r}");
    assert!(!over_grpc.allowed, "{over_grpc:?}");
    assert_eq!(over_grpc.reservation, "", "{over_grpc:?}");
    assert!(!over_grpc.admitted_without_store, "{over_grpc:?}");
}
