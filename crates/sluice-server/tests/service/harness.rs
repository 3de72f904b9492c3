//! The server every test of this binary talks to, and one helper per call they repeat: a gRPC
//! client that unwraps its answers ([`Rls`]), requests in the `shop` domain ([`one`],
//! [`request`]), and the HTTP calls ([`Harness::post`], [`Harness::get`], ...).

use std::path::PathBuf;
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{Value, json};
use sluice_core::{FakeClock, MemoryStore, Timestamp};
use sluice_server::{ServeOptions, Server};
use sluice_test_support::rules_file;
use tonic::transport::Channel;

const RULES: &str = r#"
domain: shop
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: account
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: beta
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: bot
    value: evil
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: health
    rate_limit: {unlimited: true}
  - key: service
    value: gold
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      plan: {name: gold, tier: 1}
  - key: service
    value: silver
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata:
      plan: {name: silver}
      shared: [a, 2, true]
  - key: team
    value_to_metric: true
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: user
    limits:
      - name: burst
        algorithm: token_bucket
        requests_per_unit: 2
        unit: second
      - name: daily
        requests_per_unit: 5
        window: 1d
  - key: spender
    rate_limit: {name: refill, algorithm: token_bucket, requests_per_unit: 20, unit: second, burst: 40}
"#;

/// A server on the rules above, on loopback ports, its counters in a memory store on a fake
/// clock.
pub(crate) struct Harness {
    pub(crate) server: Server,
    pub(crate) clock: FakeClock,
    dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl Harness {
    pub(crate) async fn start() -> Harness {
        Self::start_with(|_| {}).await
    }

    pub(crate) async fn start_with(configure: impl FnOnce(&mut ServeOptions)) -> Harness {
        let (rules, dir) = rules_file("rules.yaml", RULES);
        let mut options = ServeOptions::new(vec![rules]);
        options.http_addr = "127.0.0.1:0".parse().unwrap();
        options.grpc_addr = "127.0.0.1:0".parse().unwrap();
        configure(&mut options);
        // Midnight UTC, so every aligned window starts here and none ends during a test.
        let clock = FakeClock::at(Timestamp::from_secs(20_000 * 86_400));
        let store = Arc::new(MemoryStore::builder().clock(clock.clone()).build());
        let server = Server::start_with_store(options, store).await.unwrap();
        Harness {
            server,
            clock,
            dir,
            http: reqwest::Client::new(),
        }
    }

    pub(crate) async fn metrics(&self) -> String {
        self.get("/metrics").await.text().await.unwrap()
    }

    pub(crate) fn rules_path(&self) -> PathBuf {
        self.dir.path().join("rules.yaml")
    }

    pub(crate) async fn grpc(&self) -> Rls {
        Rls::new(self.channel().await)
    }

    /// An h2 connection to the gRPC listener, for any client.
    pub(crate) async fn channel(&self) -> Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.server.grpc_addr()))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.http_addr())
    }

    /// `POST path` with `body` as JSON: the status, the answer's JSON (`Null` if it has none)
    /// and its header fields.
    pub(crate) async fn post(
        &self,
        path: &str,
        body: &Value,
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let r = self.post_json(path, body).await;
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let body = r.json().await.unwrap_or(Value::Null);
        (status, body, headers)
    }

    /// `POST path` with `body` as JSON, the answer as it came.
    pub(crate) async fn post_json(&self, path: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// `POST path` with `body` as raw bytes, for bodies that are not valid JSON.
    pub(crate) async fn post_body(
        &self,
        path: &str,
        body: impl Into<reqwest::Body>,
    ) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .body(body)
            .send()
            .await
            .unwrap()
    }

    pub(crate) async fn get(&self, path: &str) -> reqwest::Response {
        self.http.get(self.url(path)).send().await.unwrap()
    }

    pub(crate) async fn delete(&self, path: &str) -> reqwest::Response {
        self.http.delete(self.url(path)).send().await.unwrap()
    }
}

/// A client of the rate-limit service whose calls are expected to be answered, or expected to
/// fail: each call says which, and a call that does the other fails the test.
pub(crate) struct Rls(RateLimitServiceClient<Channel>);

impl Rls {
    pub(crate) fn new(channel: Channel) -> Self {
        Rls(RateLimitServiceClient::new(channel))
    }

    /// The answer to `request`.
    pub(crate) async fn ask(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        self.0
            .should_rate_limit(request)
            .await
            .unwrap()
            .into_inner()
    }

    /// The gRPC status that refuses `request`.
    pub(crate) async fn refusal(&mut self, request: RateLimitRequest) -> tonic::Status {
        self.0.should_rate_limit(request).await.unwrap_err()
    }
}

pub(crate) fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A request in the `shop` domain with `descriptors`.
pub(crate) fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "shop".into(),
        descriptors,
        hits_addend: 0,
    }
}

/// A request in the `shop` domain with one descriptor of `entries`.
pub(crate) fn one(entries: &[(&str, &str)]) -> RateLimitRequest {
    request(vec![descriptor(entries)])
}

/// A descriptor's own `hits_addend` of `n` (present, so even 0 overrides the request's).
pub(crate) fn addend(n: u64) -> Option<UInt64Value> {
    Some(UInt64Value { value: n })
}

/// The JSON body of a request in the `shop` domain with one descriptor of one entry, for `/json`
/// and `/v1/check` alike.
pub(crate) fn json_one(key: &str, value: &str) -> Value {
    json!({"domain": "shop", "descriptors": [{"entries": [{"key": key, "value": value}]}]})
}

/// A counter key as the admin API's path segment: every byte percent-encoded.
pub(crate) fn key_path(key: &str) -> String {
    key.bytes().map(|b| format!("%{b:02X}")).collect()
}

/// The overall code, then each descriptor's.
pub(crate) fn codes(r: &RateLimitResponse) -> Vec<i32> {
    std::iter::once(r.overall_code)
        .chain(r.statuses.iter().map(|s| s.code))
        .collect()
}

/// One unary call of `message` at `path`, read back as a `RateLimitResponse`: for calls the
/// generated client cannot make (another path, another message).
pub(crate) async fn unary<M>(
    channel: Channel,
    path: &'static str,
    message: M,
) -> Result<RateLimitResponse, tonic::Status>
where
    M: prost::Message + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    grpc.unary(
        tonic::Request::new(message),
        http::uri::PathAndQuery::from_static(path),
        tonic_prost::ProstCodec::<M, RateLimitResponse>::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}
