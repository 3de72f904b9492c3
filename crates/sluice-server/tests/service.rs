//! The service end to end: a real server on loopback ports, a real gRPC client and a real HTTP
//! client. Counters live in a memory store on a fake clock, so no test depends on timing.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor,
    rate_limit_descriptor::{Entry, RateLimitOverride},
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse, rate_limit_response::Code,
    rate_limit_response::rate_limit::Unit,
};
use serde_json::{Value, json};
use sluice_core::{FakeClock, MemoryStore, Timestamp};
use sluice_limiter::{HeaderStyle, Outcome};
use sluice_server::{ServeOptions, Server};

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
"#;

struct Harness {
    server: Server,
    clock: FakeClock,
    dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl Harness {
    async fn start() -> Harness {
        Self::start_with(|_| {}).await
    }

    async fn start_with(configure: impl FnOnce(&mut ServeOptions)) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("rules.yaml");
        std::fs::write(&rules, RULES).unwrap();
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

    async fn metrics(&self) -> String {
        let r = self.http.get(self.url("/metrics")).send().await.unwrap();
        r.text().await.unwrap()
    }

    fn rules_path(&self) -> PathBuf {
        self.dir.path().join("rules.yaml")
    }

    async fn grpc(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::new(self.channel().await)
    }

    /// An h2 connection to the gRPC listener, for any client.
    async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.server.grpc_addr()))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.http_addr())
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value, reqwest::header::HeaderMap) {
        let r = self
            .http
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let body = r.json().await.unwrap_or(Value::Null);
        (status, body, headers)
    }
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
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

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "shop".into(),
        descriptors,
        hits_addend: 0,
    }
}

#[tokio::test]
async fn grpc_limits_a_client_and_reports_envoy_statuses() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;
    for remaining in [2, 1, 0] {
        let r = client
            .should_rate_limit(request(vec![descriptor(&[("client", "a")])]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32);
        let s = &r.statuses[0];
        assert_eq!(s.code, Code::Ok as i32);
        assert_eq!(s.limit_remaining, remaining);
        let limit = s.current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (3, Unit::Minute as i32)
        );
        assert_eq!(s.duration_until_reset.as_ref().unwrap().seconds, 60);
    }
    let r = client
        .should_rate_limit(request(vec![descriptor(&[("client", "a")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    // Another client has its own counter; after the minute the first is back.
    let r = client
        .should_rate_limit(request(vec![descriptor(&[("client", "b")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    h.clock.advance(Duration::from_secs(60));
    let r = client
        .should_rate_limit(request(vec![descriptor(&[("client", "a")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    let metrics = h.server.limiter().metrics();
    assert_eq!(
        metrics.decisions_of("shop", "shop/client", Outcome::Limited),
        1
    );
    assert_eq!(
        metrics.decisions_of("shop", "shop/client", Outcome::Allowed),
        5
    );
}

#[tokio::test]
async fn hits_addend_counts_as_the_proto_says() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;
    // Request-level 0 counts as 1.
    let r = client
        .should_rate_limit(request(vec![descriptor(&[("client", "c")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 2);
    // A present per-descriptor 0 checks without consuming, overriding the request's 2.
    let mut d = descriptor(&[("client", "c")]);
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
    let mut req = request(vec![d]);
    req.hits_addend = 2;
    let r = client.should_rate_limit(req).await.unwrap().into_inner();
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 2)
    );
    // The request's 2 applies to a descriptor without its own.
    let mut req = request(vec![descriptor(&[("client", "c")])]);
    req.hits_addend = 2;
    let r = client.should_rate_limit(req).await.unwrap().into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 0);
}

#[tokio::test]
async fn a_refused_request_consumes_nothing_from_any_descriptor() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;
    let both = || {
        request(vec![
            descriptor(&[("account", "acme")]),
            descriptor(&[("bot", "evil")]),
        ])
    };
    for _ in 0..5 {
        let r = client.should_rate_limit(both()).await.unwrap().into_inner();
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        assert_eq!(r.statuses[0].code, Code::Ok as i32);
        assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
    }
    let r = client
        .should_rate_limit(request(vec![descriptor(&[("account", "acme")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.statuses[0].limit_remaining, 99,
        "the refused requests did not count"
    );
}

#[tokio::test]
async fn shadow_mode_answers_ok_with_nothing_remaining() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;
    let first = client
        .should_rate_limit(request(vec![descriptor(&[("beta", "x")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.overall_code, Code::Ok as i32);
    let second = client
        .should_rate_limit(request(vec![descriptor(&[("beta", "x")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.overall_code, Code::Ok as i32);
    assert_eq!(second.statuses[0].code, Code::Ok as i32);
    assert_eq!(second.statuses[0].limit_remaining, 0);
    let metrics = h.server.limiter().metrics();
    assert_eq!(
        metrics.decisions_of("shop", "shop/beta", Outcome::ShadowLimited),
        1
    );
    // The native API still tells it apart.
    let (status, body, _) = h
        .post("/v1/check", &json!({"domain": "shop", "descriptors": [{"entries": [{"key": "beta", "value": "x"}]}]}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        body["descriptors"][0]["limits"][0]["outcome"],
        "shadow_limited"
    );
}

#[tokio::test]
async fn unknown_domains_and_unlimited_descriptors_pass() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;
    let mut req = request(vec![descriptor(&[("client", "a")])]);
    req.domain = "nobody".into();
    for _ in 0..10 {
        let r = client
            .should_rate_limit(req.clone())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32);
        let r = client
            .should_rate_limit(request(vec![descriptor(&[("health", "x")])]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert!(r.statuses[0].current_limit.is_none());
    }
}

#[tokio::test]
async fn a_per_request_limit_override_replaces_the_rule() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;
    let mut d = descriptor(&[("client", "o")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: Unit::Hour as i32,
    });
    let r = client
        .should_rate_limit(request(vec![d.clone()]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, Unit::Hour as i32)
    );
    let r = client
        .should_rate_limit(request(vec![d]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
}

#[tokio::test]
async fn invalid_grpc_requests_get_invalid_argument_with_a_reason() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;
    let cases = [
        (
            RateLimitRequest {
                domain: String::new(),
                descriptors: vec![descriptor(&[("a", "b")])],
                hits_addend: 0,
            },
            "domain",
        ),
        (request(vec![]), "descriptors"),
        (request(vec![descriptor(&[("", "v")])]), "key"),
        (
            request((0..65).map(|_| descriptor(&[("a", "b")])).collect()),
            "limit of 64",
        ),
        (
            request(vec![descriptor(&[("a", &"x".repeat(2000))])]),
            "value",
        ),
    ];
    for (req, needle) in cases {
        let status = client.should_rate_limit(req).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(needle), "{}", status.message());
    }
}

/// One unary call of `message` at `path`, read back as a `RateLimitResponse`: for calls the
/// generated client cannot make (another path, another message).
async fn unary<M>(
    channel: tonic::transport::Channel,
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

/// A message that does not decode as a `RateLimitRequest` (its domain not UTF-8) is refused
/// with `INVALID_ARGUMENT` and the reason, as other bad input is.
#[tokio::test]
async fn a_message_that_is_not_a_rate_limit_request_is_an_invalid_argument() {
    #[derive(Clone, PartialEq, prost::Message)]
    struct NotUtf8Domain {
        #[prost(bytes = "vec", tag = "1")]
        domain: Vec<u8>,
    }
    let h = Harness::start().await;
    let status = unary(
        h.channel().await,
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        NotUtf8Domain {
            domain: vec![0xff, 0xfe],
        },
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("not a RateLimitRequest"),
        "{}",
        status.message()
    );
}

/// A message larger than one h2 frame (16 KiB) arrives in several and is read whole; one past
/// the 64 KiB limit is refused with `OUT_OF_RANGE` and the limit, and the connection goes on.
#[tokio::test]
async fn grpc_messages_over_several_frames_are_read_and_oversized_ones_refused() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;
    let value = "v".repeat(20);
    let entries: Vec<(String, String)> =
        (0..30).map(|i| (format!("k{i}"), value.clone())).collect();
    let wide = || {
        let pairs: Vec<(&str, &str)> = entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        descriptor(&pairs)
    };
    let big = request((0..60).map(|_| wide()).collect());
    let size = prost::Message::encoded_len(&big);
    assert!((40_000..65_536).contains(&size), "{size} bytes");
    let r = client.should_rate_limit(big).await.unwrap().into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses.len(), 60);

    let too_big = request(
        (0..64)
            .map(|_| descriptor(&[("a", &"x".repeat(1_024))]))
            .collect(),
    );
    assert!(prost::Message::encoded_len(&too_big) > 65_536);
    let status = client.should_rate_limit(too_big).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("65536"), "{}", status.message());
    let r = client
        .should_rate_limit(request(vec![descriptor(&[("client", "a")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 2);
}

#[tokio::test]
async fn grpc_answers_carry_ratelimit_headers_when_asked() {
    let h = Harness::start_with(|o| o.grpc_headers = HeaderStyle::Both).await;
    let mut client = h.grpc().await;
    let r = client
        .should_rate_limit(request(vec![descriptor(&[("user", "u")])]))
        .await
        .unwrap()
        .into_inner();
    let get = |name: &str| {
        r.response_headers_to_add
            .iter()
            .find(|h| h.key == name)
            .map(|h| h.value.clone())
    };
    assert_eq!(
        get("ratelimit-policy").unwrap(),
        r#""burst";q=2;w=1, "daily";q=5;w=86400"#
    );
    assert_eq!(
        get("ratelimit").unwrap(),
        r#""burst";r=1;t=1, "daily";r=4;t=86400"#
    );
    assert_eq!(get("x-ratelimit-remaining").unwrap(), "1");
}

#[tokio::test]
async fn grpc_health_reports_serving() {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let h = Harness::start().await;
    let mut health = HealthClient::new(h.channel().await);
    let r = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status, 1, "SERVING");
}

/// A path that names no service the listener has, or a method the rate-limit service does
/// not have, is answered `UNIMPLEMENTED` with the path, and the connection goes on serving.
#[tokio::test]
async fn unknown_grpc_services_and_methods_are_unimplemented() {
    let h = Harness::start().await;
    let channel = h.channel().await;
    for path in [
        "/pb.lyft.ratelimit.RateLimitService/ShouldRateLimit",
        "/envoy.service.ratelimit.v3.RateLimitServiceX/ShouldRateLimit",
        "/envoy.service.ratelimit.v3.RateLimitService/NoSuchMethod",
    ] {
        let status = unary(channel.clone(), path, RateLimitRequest::default())
            .await
            .expect_err(path);
        assert_eq!(
            status.code(),
            tonic::Code::Unimplemented,
            "{path}: {status:?}"
        );
    }
    let mut client = RateLimitServiceClient::new(channel);
    let answer = client
        .should_rate_limit(request(vec![descriptor(&[("client", "a")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32);
    assert_eq!(answer.statuses[0].limit_remaining, 2);
}

#[tokio::test]
async fn json_endpoint_speaks_envoys_json() {
    let h = Harness::start().await;
    let body = json!({"domain": "shop", "descriptors": [{"entries": [{"key": "client", "value": "j"}]}], "hits_addend": 3});
    let (status, r, _) = h.post("/json", &body).await;
    assert_eq!(status, 200);
    assert_eq!(r["overallCode"], "OK");
    assert_eq!(r["statuses"][0]["code"], "OK");
    assert_eq!(
        r["statuses"][0]["currentLimit"],
        json!({"requestsPerUnit": 3, "unit": "MINUTE"})
    );
    assert_eq!(r["statuses"][0]["durationUntilReset"], "60s");
    assert!(
        r["statuses"][0].get("limitRemaining").is_none(),
        "zero is omitted, as protobuf JSON does"
    );
    let (status, r, _) = h.post("/json", &body).await;
    assert_eq!(status, 429);
    assert_eq!(r["overallCode"], "OVER_LIMIT");
}

#[tokio::test]
async fn native_check_returns_decisions_and_headers() {
    let h = Harness::start().await;
    let body =
        json!({"domain": "shop", "descriptors": [{"entries": [{"key": "user", "value": "n"}]}]});
    for _ in 0..2 {
        let (status, _, _) = h.post("/v1/check", &body).await;
        assert_eq!(status, 200);
    }
    let (status, r, headers) = h.post("/v1/check", &body).await;
    assert_eq!(status, 429);
    assert_eq!(r["allowed"], false);
    let limits = &r["descriptors"][0]["limits"];
    assert_eq!(limits[0]["name"], "burst");
    assert_eq!(limits[0]["allowed"], false);
    assert_eq!(limits[0]["retry_after"], 0.5);
    assert_eq!(limits[1]["name"], "daily");
    assert_eq!(
        limits[1]["remaining"], 3,
        "the burst refusal did not burn the daily quota"
    );
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(
        headers["ratelimit"],
        r#""burst";r=0;t=1, "daily";r=3;t=86400"#
    );
    // A cost of its own per descriptor.
    h.clock.advance(Duration::from_secs(1));
    let body = json!({"domain": "shop", "descriptors": [{"entries": [{"key": "user", "value": "n"}], "cost": 2}]});
    let (_, r, _) = h.post("/v1/check", &body).await;
    assert_eq!(r["descriptors"][0]["limits"][1]["remaining"], 1);
}

#[tokio::test]
async fn bad_http_input_gets_a_problem_naming_the_field() {
    let h = Harness::start().await;
    let cases = [
        (json!({"domain": 7, "descriptors": []}), 400, "domain"),
        (
            json!({"domain": "shop", "descriptors": [{"entries": [{"key": "a", "value": 1}]}]}),
            400,
            "descriptors[0].entries[0].value",
        ),
        (json!({"domain": "shop"}), 400, ""),
        (
            json!({"domain": "shop", "descriptors": [{"entries": [{"key": "a"}], "limit": {"requests_per_unit": 1, "unit": "fortnight"}}]}),
            400,
            "descriptors[0].limit.unit",
        ),
    ];
    for (body, status, field) in cases {
        for path in ["/json", "/v1/check"] {
            let r = h.http.post(h.url(path)).json(&body).send().await.unwrap();
            assert_eq!(r.status().as_u16(), status, "{path} {body}");
            assert_eq!(r.headers()["content-type"], "application/problem+json");
            let problem: Value = r.json().await.unwrap();
            assert!(!problem["detail"].as_str().unwrap().is_empty());
            if !field.is_empty() {
                assert_eq!(problem["field"], field, "{problem}");
            }
        }
    }
    let r = h
        .http
        .post(h.url("/json"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    // A valid request followed by anything else is not a valid body.
    let r = h
        .http
        .post(h.url("/json"))
        .body(r#"{"domain": "shop", "descriptors": []} {"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let problem: Value = r.json().await.unwrap();
    assert!(
        problem["detail"].as_str().unwrap().contains("trailing"),
        "{problem}"
    );
    // A string that is not UTF-8 (a lone continuation byte in the value).
    for path in ["/json", "/v1/check"] {
        let mut body =
            br#"{"domain": "shop", "descriptors": [{"entries": [{"key": "a", "value": "x"#.to_vec();
        body.extend_from_slice(b"\x80\"}]}]}");
        let r = h.http.post(h.url(path)).body(body).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 400, "{path}");
        let problem: Value = r.json().await.unwrap();
        assert!(
            problem["detail"].as_str().unwrap().contains("not UTF-8"),
            "{path} {problem}"
        );
    }
    let r = h
        .http
        .post(h.url("/json"))
        .body(vec![b' '; 100_000])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let r = h.http.get(h.url("/nope")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let h = Harness::start().await;
    for path in ["/healthz", "/readyz"] {
        let r = h.http.get(h.url(path)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
    let body =
        json!({"domain": "shop", "descriptors": [{"entries": [{"key": "bot", "value": "evil"}]}]});
    h.post("/json", &body).await;
    let text = h.metrics().await;
    assert!(
        text.contains(
            r#"sluice_decisions_total{domain="shop",rule="shop/bot=evil",outcome="limited"} 1"#
        ),
        "{text}"
    );
    assert!(text.contains("sluice_decision_latency_seconds_count 1"));
    assert!(text.contains("sluice_tracked_keys"));
    assert!(text.contains("sluice_rule_reloads_total 0"));
    assert!(text.contains("sluice_rule_reload_failures_total 0"));
    assert!(text.contains(r#"sluice_build_info{version="#));
    // Limited counters are listed by a hash: their keys hold request values.
    assert!(
        text.contains(r#"sluice_top_limited_keys{key_hash=""#),
        "{text}"
    );
    assert!(
        !text.contains("bot=evil}:"),
        "a counter key in /metrics: {text}"
    );
}

#[tokio::test]
async fn admin_shows_reloads_inspects_and_resets() {
    let h = Harness::start().await;
    let rules: Value = h
        .http
        .get(h.url("/v1/rules"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(rules["domains"][0]["domain"], "shop");

    // Exhaust a client, find its counter, inspect it and reset it.
    let body =
        json!({"domain": "shop", "descriptors": [{"entries": [{"key": "client", "value": "z"}]}]});
    let mut key = String::new();
    for _ in 0..4 {
        let (_, r, _) = h.post("/v1/check", &body).await;
        key = r["descriptors"][0]["limits"][0]["key"]
            .as_str()
            .unwrap()
            .to_owned();
    }
    let encoded: String = key.bytes().map(|b| format!("%{b:02X}")).collect();
    let state: Value = h
        .http
        .get(h.url(&format!("/v1/keys/{encoded}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(state["remaining"], 0);
    assert_eq!(state["limited"], true);
    let reset: Value = h
        .http
        .delete(h.url(&format!("/v1/keys/{encoded}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(reset["reset"], true);
    let (status, _, _) = h.post("/v1/check", &body).await;
    assert_eq!(status, 200, "unblocked");
    let r = h
        .http
        .get(h.url("/v1/keys/%7Bshop%7Cclient%3Dz%7D%3Aabc"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);

    // A broken file is refused with its location and the old rules stay.
    std::fs::write(h.rules_path(), "domain: shop\ndescriptors:\n  - key: client\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").unwrap();
    let r = h.http.post(h.url("/v1/reload")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 422);
    let problem: Value = r.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("rules.yaml:4:"),
        "{problem}"
    );
    // A valid one takes over.
    std::fs::write(h.rules_path(), "domain: shop\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n").unwrap();
    let r: Value = h
        .http
        .post(h.url("/v1/reload"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        r["result"] == "reloaded" || r["result"] == "unchanged",
        "{r}"
    );
    let (_, r, _) = h.post("/v1/check", &body).await;
    assert_eq!(r["descriptors"][0]["limits"][0]["limit"], 1000);
}

#[tokio::test]
async fn graceful_shutdown_stops_both_listeners() {
    let h = Harness::start().await;
    let (http, grpc) = (h.server.http_addr(), h.server.grpc_addr());
    let (status, _, _) = h
        .post(
            "/json",
            &json!({"domain": "shop", "descriptors": [{"entries": [{"key": "a"}]}]}),
        )
        .await;
    assert_eq!(status, 200);
    tokio::time::timeout(Duration::from_secs(10), h.server.shutdown())
        .await
        .unwrap();
    assert!(tokio::net::TcpStream::connect(http).await.is_err());
    assert!(tokio::net::TcpStream::connect(grpc).await.is_err());
}

#[tokio::test]
async fn invalid_rules_stop_the_start_with_their_location() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, "domain: x\ndescriptors:\n  - key: a\n    rate_limt: {unit: second, requests_per_unit: 1}\n").unwrap();
    let mut options = ServeOptions::new(vec![path]);
    options.http_addr = "127.0.0.1:0".parse().unwrap();
    options.grpc_addr = "127.0.0.1:0".parse().unwrap();
    let err = Server::start(options).await.unwrap_err().to_string();
    assert!(err.contains("bad.yaml:4:5"), "{err}");
    assert!(
        err.contains("rate_limit"),
        "suggests the right field: {err}"
    );
}

/// envoyproxy/ratelimit's answers, over gRPC and `POST /json` alike: an unlimited descriptor
/// reports 4294967295 remaining and no limit; a refusal reports 0 remaining even when a cheaper
/// request would still fit; a descriptor with no entries is not limited and not an error.
#[tokio::test]
async fn envoy_answer_rules_hold_on_grpc_and_json() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;

    // Unlimited.
    let r = client
        .should_rate_limit(request(vec![descriptor(&[("health", "x")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert!(r.statuses[0].current_limit.is_none());
    let body =
        json!({"domain": "shop", "descriptors": [{"entries": [{"key": "health", "value": "x"}]}]});
    let (status, j, _) = h.post("/json", &body).await;
    assert_eq!(status, 200);
    assert_eq!(j["statuses"][0]["limitRemaining"], json!(u32::MAX));
    assert!(j["statuses"][0].get("currentLimit").is_none(), "{j}");

    // Refused with room left for a cheaper request: 3 a minute, 2 used, a request of 2.
    for (path, user) in [("grpc", "r1"), ("/json", "r2")] {
        let one = |addend: u64| {
            let mut req = request(vec![descriptor(&[("client", user)])]);
            req.hits_addend = addend as u32;
            req
        };
        if path == "grpc" {
            client.should_rate_limit(one(2)).await.unwrap();
            let r = client.should_rate_limit(one(2)).await.unwrap().into_inner();
            assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
            assert_eq!(r.statuses[0].limit_remaining, 0, "over the limit reads 0");
        } else {
            let body = |n: u64| json!({"domain": "shop", "hits_addend": n, "descriptors": [{"entries": [{"key": "client", "value": user}]}]});
            h.post("/json", &body(2)).await;
            let (status, j, _) = h.post("/json", &body(2)).await;
            assert_eq!(status, 429);
            assert_eq!(j["statuses"][0]["code"], "OVER_LIMIT");
            assert!(
                j["statuses"][0].get("limitRemaining").is_none(),
                "0, omitted: {j}"
            );
            // The native answer keeps the true remainder.
            let (_, c, _) = h
                .post("/v1/check", &json!({"domain": "shop", "cost": 2, "descriptors": [{"entries": [{"key": "client", "value": user}]}]}))
                .await;
            assert_eq!(c["descriptors"][0]["limits"][0]["remaining"], 1, "{c}");
        }
    }

    // The reset in whole seconds, rounded up: 58.5 s left of the minute reads 59 s.
    h.clock.advance(std::time::Duration::from_millis(1500));
    let r = client
        .should_rate_limit(request(vec![descriptor(&[("client", "reset")])]))
        .await
        .unwrap()
        .into_inner();
    let reset = r.statuses[0].duration_until_reset.unwrap();
    assert_eq!((reset.seconds, reset.nanos), (59, 0));
    let body = json!({"domain": "shop", "descriptors": [{"entries": [{"key": "client", "value": "reset"}]}]});
    let (_, j, _) = h.post("/json", &body).await;
    assert_eq!(j["statuses"][0]["durationUntilReset"], "59s");

    // A limit override for a domain no rule defines applies no limit.
    let mut d = descriptor(&[("client", "o")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: Unit::Hour as i32,
    });
    let mut unknown = request(vec![d]);
    unknown.domain = "nobody".into();
    for _ in 0..3 {
        let r = client
            .should_rate_limit(unknown.clone())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert!(r.statuses[0].current_limit.is_none());
    }

    // A descriptor with no entries beside a limited one: not limited, not an error.
    let r = client
        .should_rate_limit(request(vec![
            RateLimitDescriptor::default(),
            descriptor(&[("client", "e")]),
        ]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses.len(), 2);
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(r.statuses[1].limit_remaining, 2);
    let body = json!({"domain": "shop", "descriptors": [{"entries": []}]});
    let (status, j, _) = h.post("/json", &body).await;
    assert_eq!((status, j["overallCode"].clone()), (200, json!("OK")));
}

fn codes(r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse) -> Vec<i32> {
    std::iter::once(r.overall_code)
        .chain(r.statuses.iter().map(|s| s.code))
        .collect()
}

#[tokio::test]
async fn quota_mode_refuses_only_when_every_quota_descriptor_does() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    let both = || {
        request(vec![
            descriptor(&[("service", "gold")]),
            descriptor(&[("service", "silver")]),
        ])
    };
    let mut answers = Vec::new();
    for _ in 0..3 {
        let r = client.should_rate_limit(both()).await.unwrap().into_inner();
        answers.push(codes(&r));
    }
    // gold allows 1 a minute and silver 2: the second request passes on silver alone, and
    // gold, refused, consumed nothing; the third finds both spent.
    assert_eq!(
        answers,
        [vec![ok, ok, ok], vec![ok, over, ok], vec![over, over, over]]
    );

    // Beside an ordinary limit: every quota descriptor refused refuses the request, and the
    // ordinary limit consumes nothing.
    let mixed = request(vec![
        descriptor(&[("client", "q")]),
        descriptor(&[("service", "gold")]),
    ]);
    let r = client.should_rate_limit(mixed).await.unwrap().into_inner();
    assert_eq!(codes(&r), [over, ok, over]);
    assert_eq!(
        r.statuses[0].limit_remaining, 3,
        "all 3 left, nothing consumed: {r:?}"
    );

    // The same over /json, and /v1/check follows the same verdict.
    let body = json!({"domain": "shop", "descriptors": [
        {"entries": [{"key": "service", "value": "gold"}]},
        {"entries": [{"key": "service", "value": "silver"}]}]});
    let (status, j, _) = h.post("/json", &body).await;
    assert_eq!(status, 429, "{j}");
    let (status, _, _) = h.post("/v1/check", &body).await;
    assert_eq!(status, 429);
    h.clock.advance(Duration::from_secs(60));
    let (status, j, _) = h.post("/json", &body).await;
    assert_eq!(
        (status, j["overallCode"].clone()),
        (200, json!("OK")),
        "{j}"
    );
}

#[tokio::test]
async fn the_service_wide_quota_mode_makes_every_limit_a_quota_limit() {
    let h = Harness::start_with(|o| o.envoy.quota_mode = true).await;
    let mut client = h.grpc().await;
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    let one = || request(vec![descriptor(&[("bot", "evil")])]);
    let r = client.should_rate_limit(one()).await.unwrap().into_inner();
    assert_eq!(codes(&r), [over, over], "its only descriptor refused");
    let with_other = request(vec![
        descriptor(&[("bot", "evil")]),
        descriptor(&[("client", "g")]),
    ]);
    let r = client
        .should_rate_limit(with_other)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(codes(&r), [ok, over, ok]);
    assert_eq!(r.statuses[1].limit_remaining, 2, "the passing one consumed");
}

#[tokio::test]
async fn dynamic_metadata_carries_the_request_and_the_passed_rules_metadata() {
    let h = Harness::start_with(|o| o.envoy.dynamic_metadata = true).await;
    let mut client = h.grpc().await;
    let mut req = request(vec![
        descriptor(&[("service", "gold")]),
        descriptor(&[("service", "silver")]),
    ]);
    req.hits_addend = 1;
    req.descriptors[1].hits_addend =
        Some(envoy_types::pb::google::protobuf::UInt64Value { value: 1 });
    let first = client
        .should_rate_limit(req.clone())
        .await
        .unwrap()
        .into_inner();
    let second = client.should_rate_limit(req).await.unwrap().into_inner();
    let json_of = |r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        sluice_server::metadata::struct_json(r.dynamic_metadata.as_ref().expect("metadata"))
    };
    // Both passed: their metadata merge, the first's field kept where both have one.
    assert_eq!(
        json_of(&first),
        json!({
            "domain": "shop",
            "hitsAddend": 1.0,
            "descriptors": [
                {"entries": ["service=gold"]},
                {"entries": ["service=silver"], "hitsAddend": 1.0}
            ],
            "metadata": {"plan": {"name": "gold", "tier": 1.0}, "shared": ["a", 2.0, true]}
        })
    );
    // gold refused (quota mode): only silver's metadata.
    assert_eq!(
        json_of(&second)["metadata"],
        json!({"plan": {"name": "silver"}, "shared": ["a", 2.0, true]})
    );

    // /json carries it too; a refused request's metadata names no rule's.
    let body = json!({"domain": "shop", "descriptors": [
        {"entries": [{"key": "service", "value": "gold"}]}]});
    let (status, j, _) = h.post("/json", &body).await;
    assert_eq!(status, 429);
    assert_eq!(
        j["dynamicMetadata"],
        json!({"domain": "shop", "descriptors": [{"entries": ["service=gold"]}]})
    );

    // Off, there is none.
    let off = Harness::start().await;
    let r = off
        .grpc()
        .await
        .should_rate_limit(request(vec![descriptor(&[("service", "gold")])]))
        .await
        .unwrap()
        .into_inner();
    assert!(r.dynamic_metadata.is_none());
}

#[tokio::test]
async fn value_to_metric_and_detailed_metric_put_request_values_in_the_label() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;
    for d in [
        descriptor(&[("team", "red"), ("path", "/a")]),
        descriptor(&[("team", "blue"), ("path", "/a")]),
        descriptor(&[("tenant", "acme")]),
        descriptor(&[("client", "plain")]),
    ] {
        client.should_rate_limit(request(vec![d])).await.unwrap();
    }
    let text = h.metrics().await;
    for rule in [
        "shop/team=red/path",
        "shop/team=blue/path",
        "shop/tenant=acme",
        "shop/client",
    ] {
        let series =
            format!(r#"sluice_decisions_total{{domain="shop",rule="{rule}",outcome="allowed"}} 1"#);
        assert!(text.contains(&series), "{series} in {text}");
    }
}

#[tokio::test]
async fn envoys_token_quota_flow_checks_with_0_and_reports_usage_past_the_limit() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    // One descriptor with its own hits_addend, as Envoy sends a token quota.
    let hits = |n: u64, user: &str| {
        let mut d = descriptor(&[("tokens", user)]);
        d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: n });
        request(vec![d])
    };
    let mut seen = Vec::new();
    for n in [0, 60, 40, 0, 1, 0] {
        let r = client
            .should_rate_limit(hits(n, "u"))
            .await
            .unwrap()
            .into_inner();
        seen.push((n, r.statuses[0].code, r.statuses[0].limit_remaining));
    }
    assert_eq!(
        seen,
        [
            (0, ok, 100),
            (60, ok, 40),
            (40, ok, 0),
            // Exactly at the limit a check passes, as count + 0 > limit is false.
            (0, ok, 0),
            // Usage past the limit is counted, and from then on a check is over.
            (1, over, 0),
            (0, over, 0),
        ]
    );
    // An ordinary request on the same counter is refused too.
    let plain = request(vec![descriptor(&[("tokens", "u")])]);
    let r = client.should_rate_limit(plain).await.unwrap().into_inner();
    assert_eq!(r.overall_code, over);

    // A report larger than the whole limit, in a fresh window, over /json: counted, and over.
    h.clock.advance(Duration::from_secs(60));
    let body = |n: u64| {
        json!({"domain": "shop", "descriptors": [
        {"entries": [{"key": "tokens", "value": "u"}], "hits_addend": n}]})
    };
    let (status, j, _) = h.post("/json", &body(0)).await;
    assert_eq!(
        (status, j["statuses"][0]["limitRemaining"].clone()),
        (200, json!(100))
    );
    let (status, _, _) = h.post("/json", &body(150)).await;
    assert_eq!(status, 429);
    let (status, j, _) = h.post("/json", &body(0)).await;
    assert_eq!(
        (status, j["overallCode"].clone()),
        (429, json!("OVER_LIMIT"))
    );
    // An admin reset clears the usage past the limit with the counter.
    let check = json!({"domain": "shop", "cost": 0, "descriptors": [{"entries": [{"key": "tokens", "value": "u"}]}]});
    let (_, c, _) = h.post("/v1/check", &check).await;
    let key = c["descriptors"][0]["limits"][0]["key"].as_str().unwrap();
    let encoded: String = key.bytes().map(|b| format!("%{b:02X}")).collect();
    let url = h.url(&format!("/v1/keys/{encoded}"));
    let reset = h.http.delete(url).send().await.unwrap();
    assert_eq!(reset.status().as_u16(), 200);
    let (status, j, _) = h.post("/json", &body(0)).await;
    assert_eq!(
        (status, j["statuses"][0]["limitRemaining"].clone()),
        (200, json!(100))
    );
    h.post("/json", &body(150)).await;

    // A report that goes over refuses its request, and the request's other limits consume
    // nothing; a request-level hits_addend keeps the rule that a refused request consumes
    // nothing.
    let mut mixed = hits(1, "u");
    mixed.descriptors.push(descriptor(&[("client", "m")]));
    let r = client.should_rate_limit(mixed).await.unwrap().into_inner();
    assert_eq!(codes(&r), [over, over, ok]);
    assert_eq!(r.statuses[1].limit_remaining, 3, "not consumed: {r:?}");
    let mut whole = request(vec![descriptor(&[("tokens", "w")])]);
    whole.hits_addend = 150;
    let r = client.should_rate_limit(whole).await.unwrap().into_inner();
    assert_eq!(r.overall_code, over);
    let r = client
        .should_rate_limit(hits(0, "w"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (ok, 100));
}
