//! `sluice.v1.Reservations` on the gRPC port, called by the client generated from the same
//! `.proto`: the gRPC form of `reservations`' HTTP cases, with each HTTP status as its gRPC one.

use std::time::Duration;

use serde_json::json;
use sluice_server::sluice_v1::reservations_client::ReservationsClient;
use sluice_server::sluice_v1::{
    Descriptor, Entry, ReserveRequest, ReserveResponse, SettleRequest, SettleResponse,
};
use tonic::Code;
use tonic::transport::Channel;

use crate::harness::{Harness, json_one};

/// A reservation of `amount` tokens for `tenant` (the `tokens` rule: 100 a minute).
fn reserve(tenant: &str, amount: u64) -> ReserveRequest {
    ReserveRequest {
        domain: "shop".into(),
        descriptors: vec![Descriptor {
            entries: vec![Entry {
                key: "tokens".into(),
                value: tenant.into(),
            }],
        }],
        amount,
        ttl: None,
    }
}

fn settle(reservation: &str, used: u64) -> SettleRequest {
    SettleRequest {
        reservation: reservation.into(),
        used,
    }
}

/// A protobuf duration of `secs` seconds.
fn secs(secs: i64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: secs,
        nanos: 0,
    }
}

async fn client(h: &Harness) -> ReservationsClient<Channel> {
    ReservationsClient::new(h.channel().await)
}

async fn reserved(c: &mut ReservationsClient<Channel>, r: ReserveRequest) -> ReserveResponse {
    c.reserve(r).await.unwrap().into_inner()
}

async fn settled(c: &mut ReservationsClient<Channel>, r: SettleRequest) -> SettleResponse {
    c.settle(r).await.unwrap().into_inner()
}

/// What the `tokens` limit of `tenant` has left, by an HTTP check that consumes nothing.
async fn remaining(h: &Harness, tenant: &str) -> u64 {
    let mut body = json_one("tokens", tenant);
    body["descriptors"][0]["cost"] = json!(0);
    let (_, r, _) = h.post("/v1/check", &body).await;
    r["descriptors"][0]["limits"][0]["remaining"]
        .as_u64()
        .unwrap_or_else(|| panic!("no remaining in {r}"))
}

#[tokio::test]
async fn a_refused_reservation_is_ok_and_a_settle_gives_back_what_was_not_used() {
    let h = Harness::start().await;
    let mut c = client(&h).await;
    let r = reserved(&mut c, reserve("acme", 60)).await;
    assert!(r.allowed, "{r:?}");
    assert!(r.reservation.starts_with("rsv_"), "{r:?}");
    assert!(!r.admitted_without_store, "the store took it: {r:?}");
    assert_eq!(r.amount, 60);
    assert_eq!(r.ttl, Some(secs(300)), "the default ttl");
    let limit = &r.statuses[0].limits[0];
    assert_eq!((limit.limit, limit.remaining), (100, 40), "{r:?}");
    assert_eq!(limit.retry_after, Some(secs(0)));
    assert!(limit.allowed && !limit.observed && r.statuses[0].allowed);

    // 40 left: 50 is refused whole, as an OK answer, and takes nothing.
    let refused = reserved(&mut c, reserve("acme", 50)).await;
    assert!(!refused.allowed, "{refused:?}");
    assert_eq!(refused.reservation, "");
    assert!(!refused.statuses[0].allowed);
    let retry = refused.statuses[0].limits[0].retry_after.unwrap();
    assert!(retry.seconds > 0, "{refused:?}");
    assert_eq!(remaining(&h, "acme").await, 40);

    let s = settled(&mut c, settle(&r.reservation, 20)).await;
    assert_eq!((s.reserved, s.used, s.refunded, s.charged), (60, 20, 40, 0));
    assert_eq!(remaining(&h, "acme").await, 80);
    // Fits only because of the refund.
    assert!(reserved(&mut c, reserve("acme", 50)).await.allowed);
}

#[tokio::test]
async fn usage_beyond_the_reservation_is_charged() {
    let h = Harness::start().await;
    let mut c = client(&h).await;
    let r = reserved(&mut c, reserve("gamma", 10)).await;
    let s = settled(&mut c, settle(&r.reservation, 150)).await;
    assert_eq!((s.refunded, s.charged), (0, 140));
    assert_eq!(remaining(&h, "gamma").await, 0);
    let refused = reserved(&mut c, reserve("gamma", 1)).await;
    assert!(
        !refused.allowed,
        "the next reservation is refused: {refused:?}"
    );
}

#[tokio::test]
async fn a_second_settle_fails_its_precondition_and_gives_nothing_back() {
    let h = Harness::start().await;
    let mut c = client(&h).await;
    let r = reserved(&mut c, reserve("beta", 30)).await;
    settled(&mut c, settle(&r.reservation, 10)).await;
    assert_eq!(remaining(&h, "beta").await, 90);
    let again = c.settle(settle(&r.reservation, 0)).await.unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
    assert!(again.message().contains("settled before"), "{again:?}");
    assert_eq!(remaining(&h, "beta").await, 90, "nothing refunded twice");
}

#[tokio::test]
async fn an_expired_reservation_fails_its_precondition_then_is_forgotten() {
    let h = Harness::start().await;
    let mut c = client(&h).await;
    let mut request = reserve("delta", 70);
    request.ttl = Some(secs(10));
    let r = reserved(&mut c, request).await;
    assert_eq!(r.ttl, Some(secs(10)));
    h.clock.advance(Duration::from_secs(11));
    let late = c.settle(settle(&r.reservation, 0)).await.unwrap_err();
    assert_eq!(late.code(), Code::FailedPrecondition, "{late:?}");
    assert!(late.message().contains("ttl ran out"), "{late:?}");
    assert_eq!(remaining(&h, "delta").await, 30, "counted as used in full");
    h.clock.advance(Duration::from_secs(10));
    let forgotten = c.settle(settle(&r.reservation, 0)).await.unwrap_err();
    assert_eq!(forgotten.code(), Code::NotFound, "{forgotten:?}");
}

#[tokio::test]
async fn unknown_and_garbled_ids_are_not_found() {
    let h = Harness::start().await;
    let mut c = client(&h).await;
    for id in [
        "rsv_0123456789abcdef0123456789abcdef".to_owned(),
        "rsv_nothex".to_owned(),
        String::new(),
        "x".repeat(5000),
    ] {
        let e = c.settle(settle(&id, 1)).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{id}: {e:?}");
        assert!(e.message().len() < 300, "the id is cut short: {e:?}");
    }
}

#[tokio::test]
async fn bad_input_is_an_invalid_argument_naming_the_field_and_takes_nothing() {
    let h = Harness::start().await;
    let mut c = client(&h).await;
    let invalid = |e: tonic::Status, field: &str| {
        assert_eq!(e.code(), Code::InvalidArgument, "{field}: {e:?}");
        assert!(
            e.message().contains(&format!("`{field}`")),
            "{field}: {e:?}"
        );
    };
    for amount in [0, u64::from(u32::MAX) + 1, u64::MAX] {
        invalid(
            c.reserve(reserve("zeta", amount)).await.unwrap_err(),
            "amount",
        );
    }
    for ttl in [
        secs(0),
        secs(7200),
        secs(-3),
        prost_types::Duration {
            seconds: 0,
            nanos: -5,
        },
    ] {
        let mut request = reserve("zeta", 5);
        request.ttl = Some(ttl);
        invalid(c.reserve(request).await.unwrap_err(), "ttl");
    }
    let mut no_domain = reserve("zeta", 5);
    no_domain.domain.clear();
    invalid(c.reserve(no_domain).await.unwrap_err(), "domain");
    let mut no_descriptors = reserve("zeta", 5);
    no_descriptors.descriptors.clear();
    invalid(c.reserve(no_descriptors).await.unwrap_err(), "descriptors");
    assert_eq!(remaining(&h, "zeta").await, 100, "nothing was taken");

    let r = reserved(&mut c, reserve("zeta", 5)).await;
    let e = c
        .settle(settle(&r.reservation, u64::from(u32::MAX) + 1))
        .await
        .unwrap_err();
    invalid(e, "used");
    assert_eq!(remaining(&h, "zeta").await, 95, "no bad settle refunded");
    let s = settled(&mut c, settle(&r.reservation, 5)).await;
    assert_eq!(s.reserved, 5, "nor settled it");
}

#[tokio::test]
async fn shadow_limits_are_observed_untouched_and_the_service_reports_serving() {
    let h = Harness::start().await;
    let mut c = client(&h).await;
    let mut request = reserve("eps", 1);
    request.descriptors.push(Descriptor {
        entries: vec![Entry {
            key: "beta".into(),
            value: "eps".into(),
        }],
    });
    request.amount = 2;
    let r = reserved(&mut c, request).await;
    assert!(r.allowed, "{r:?}");
    // The shadow limit of 1 a minute is looked at, not taken from.
    let shadow = &r.statuses[1].limits[0];
    assert!(shadow.observed, "{r:?}");
    assert_eq!((shadow.limit, shadow.remaining), (1, 1), "{r:?}");
    assert!(r.statuses[1].allowed);

    let mut health = tonic_health::pb::health_client::HealthClient::new(h.channel().await);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "sluice.v1.Reservations".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
}

#[tokio::test]
async fn the_hybrid_store_holds_reservations() {
    use sluice_redis::testing::{shared_server, unique_prefix};
    use sluice_server::{ServeOptions, Server};

    // The hybrid store, over a real Redis, holds reservations as the other stores do.
    let rules = "domain: shop\ndescriptors:\n  - key: tokens\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
    let (rules, _dir) = sluice_test_support::rules_file("rules.yaml", rules);
    let mut options = ServeOptions::new(vec![rules]);
    options.http_addr = "127.0.0.1:0".parse().unwrap();
    options.grpc_addr = "127.0.0.1:0".parse().unwrap();
    options.store = format!("hybrid+{}", shared_server().url());
    options.store_settings.prefix = unique_prefix();
    // Not the default 50 ms: on a loaded machine a Redis call can take longer, and the rule's
    // `on_store_error` would then admit the reservation without a record (or a settle fail).
    options.store_settings.timeout = Duration::from_secs(5);
    let server = Server::start(options).await.unwrap();
    let mut c = ReservationsClient::connect(format!("http://{}", server.grpc_addr()))
        .await
        .unwrap();
    let r = reserved(&mut c, reserve("acme", 5)).await;
    assert!(r.allowed && r.reservation.starts_with("rsv_"), "{r:?}");
    let s = settled(&mut c, settle(&r.reservation, 2)).await;
    assert_eq!((s.reserved, s.used, s.refunded, s.charged), (5, 2, 3, 0));
    let again = c.settle(settle(&r.reservation, 0)).await.unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
    let e = c
        .settle(settle("rsv_0123456789abcdef0123456789abcdef", 1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    server.shutdown().await;
}
