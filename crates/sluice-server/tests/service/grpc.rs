//! Envoy's `ShouldRateLimit` over gRPC: statuses, `hits_addend`, refusals that consume nothing,
//! shadow mode, overrides, invalid and oversized messages, the rate-limit headers, health, and
//! paths the listener does not serve.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, rate_limit_response::Code, rate_limit_response::rate_limit::Unit,
};
use sluice_limiter::{HeaderStyle, Outcome};

use crate::harness::{Harness, Rls, addend, descriptor, json_one, one, request, unary};

#[tokio::test]
async fn grpc_limits_a_client_and_reports_envoy_statuses() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;
    for remaining in [2, 1, 0] {
        let r = client.ask(one(&[("client", "a")])).await;
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
    let r = client.ask(one(&[("client", "a")])).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    // Another client has its own counter; after the minute the first is back.
    let r = client.ask(one(&[("client", "b")])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    h.clock.advance(Duration::from_secs(60));
    let r = client.ask(one(&[("client", "a")])).await;
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
    let r = client.ask(one(&[("client", "c")])).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
    // A present per-descriptor 0 checks without consuming, overriding the request's 2.
    let mut d = descriptor(&[("client", "c")]);
    d.hits_addend = addend(0);
    let mut req = request(vec![d]);
    req.hits_addend = 2;
    let r = client.ask(req).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 2)
    );
    // The request's 2 applies to a descriptor without its own.
    let mut req = one(&[("client", "c")]);
    req.hits_addend = 2;
    let r = client.ask(req).await;
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
        let r = client.ask(both()).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        assert_eq!(r.statuses[0].code, Code::Ok as i32);
        assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
    }
    let r = client.ask(one(&[("account", "acme")])).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 99,
        "the refused requests did not count"
    );
}

#[tokio::test]
async fn shadow_mode_answers_ok_with_nothing_remaining() {
    let h = Harness::start().await;
    let mut client = h.grpc().await;
    let first = client.ask(one(&[("beta", "x")])).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    let second = client.ask(one(&[("beta", "x")])).await;
    assert_eq!(second.overall_code, Code::Ok as i32);
    assert_eq!(second.statuses[0].code, Code::Ok as i32);
    assert_eq!(second.statuses[0].limit_remaining, 0);
    let metrics = h.server.limiter().metrics();
    assert_eq!(
        metrics.decisions_of("shop", "shop/beta", Outcome::ShadowLimited),
        1
    );
    // The native API still tells it apart.
    let (status, body, _) = h.post("/v1/check", &json_one("beta", "x")).await;
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
    let mut req = one(&[("client", "a")]);
    req.domain = "nobody".into();
    for _ in 0..10 {
        let r = client.ask(req.clone()).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        let r = client.ask(one(&[("health", "x")])).await;
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
    let r = client.ask(request(vec![d.clone()])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, Unit::Hour as i32)
    );
    let r = client.ask(request(vec![d])).await;
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
        (one(&[("", "v")]), "key"),
        (
            request((0..65).map(|_| descriptor(&[("a", "b")])).collect()),
            "limit of 64",
        ),
        (one(&[("a", &"x".repeat(2000))]), "value"),
    ];
    for (req, needle) in cases {
        let status = client.refusal(req).await;
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(needle), "{}", status.message());
    }
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
    let r = client.ask(big).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses.len(), 60);

    let too_big = request(
        (0..64)
            .map(|_| descriptor(&[("a", &"x".repeat(1_024))]))
            .collect(),
    );
    assert!(prost::Message::encoded_len(&too_big) > 65_536);
    let status = client.refusal(too_big).await;
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("65536"), "{}", status.message());
    let r = client.ask(one(&[("client", "a")])).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
}

#[tokio::test]
async fn grpc_answers_carry_ratelimit_headers_when_asked() {
    let h = Harness::start_with(|o| o.grpc_headers = HeaderStyle::Both).await;
    let mut client = h.grpc().await;
    let r = client.ask(one(&[("user", "u")])).await;
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
    let mut client = Rls::new(channel);
    let answer = client.ask(one(&[("client", "a")])).await;
    assert_eq!(answer.overall_code, Code::Ok as i32);
    assert_eq!(answer.statuses[0].limit_remaining, 2);
}

/// 65 descriptors, the last of which does not even decode (its entry's key is not UTF-8), are
/// refused for their number: the counts are checked on the wire, before decoding builds every
/// descriptor of the message (a 64 KiB message holds 32,000 empty ones). So is a descriptor's
/// 33rd entry.
#[tokio::test]
async fn too_many_descriptors_or_entries_are_refused_before_the_message_is_decoded() {
    #[derive(Clone, PartialEq, prost::Message)]
    struct RawEntry {
        #[prost(bytes = "vec", tag = "1")]
        key: Vec<u8>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct RawDescriptor {
        #[prost(message, repeated, tag = "1")]
        entries: Vec<RawEntry>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct RawRequest {
        #[prost(string, tag = "1")]
        domain: String,
        #[prost(message, repeated, tag = "2")]
        descriptors: Vec<RawDescriptor>,
    }
    let entry = |key: &[u8]| RawEntry { key: key.to_vec() };
    let fine = RawDescriptor {
        entries: vec![entry(b"client")],
    };
    let broken = RawDescriptor {
        entries: vec![entry(&[0xff, 0xfe])],
    };
    let mut many_descriptors = vec![fine.clone(); 64];
    many_descriptors.push(broken.clone());
    let mut many_entries = vec![entry(b"client"); 32];
    many_entries.push(entry(&[0xff, 0xfe]));
    let h = Harness::start().await;
    let path = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    for (descriptors, needle) in [
        (
            many_descriptors,
            "`descriptors` has 65, more than the limit of 64",
        ),
        (
            vec![
                fine,
                RawDescriptor {
                    entries: many_entries,
                },
            ],
            "`descriptors[1].entries` has 33, more than the limit of 32",
        ),
    ] {
        let message = RawRequest {
            domain: "shop".into(),
            descriptors,
        };
        let status = unary(h.channel().await, path, message).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(needle), "{}", status.message());
    }
}

/// A gRPC answer has no `content-length` (no gRPC server sends one: the trailers follow the
/// message, and a client that trusts the length, as `curl --http2-prior-knowledge` does, never
/// reads `grpc-status`), and ends with its status in the trailers, for `ShouldRateLimit` and
/// the health service alike.
#[tokio::test]
async fn grpc_answers_carry_no_content_length_and_end_with_their_status() {
    use bytes::Bytes;
    use prost::Message;
    let h = Harness::start().await;
    let addr = h.server.grpc_addr();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let should_rate_limit = one(&[("client", "a")]).encode_to_vec();
    for (path, message) in [
        (
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            should_rate_limit,
        ),
        ("/grpc.health.v1.Health/Check", Vec::new()),
    ] {
        let mut send = send.clone().ready().await.unwrap();
        let request = http::Request::post(format!("http://{addr}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (answer, mut body) = send.send_request(request, false).unwrap();
        let mut framed = vec![0];
        framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        framed.extend_from_slice(&message);
        body.send_data(Bytes::from(framed), true).unwrap();
        let answer = answer.await.unwrap();
        assert_eq!(answer.status(), 200, "{path}");
        assert!(
            answer.headers().get("content-length").is_none(),
            "{path}: {:?}",
            answer.headers()
        );
        let mut body = answer.into_body();
        while let Some(data) = body.data().await {
            let data = data.unwrap();
            let _ = body.flow_control().release_capacity(data.len());
        }
        let trailers = body.trailers().await.unwrap().expect("trailers");
        assert_eq!(trailers.get("grpc-status").unwrap(), "0", "{path}");
    }
}
