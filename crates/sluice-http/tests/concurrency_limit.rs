//! `SharedLimitLayer` over a route with a concurrency limit: each request holds a slot while
//! its answer's body is alive; the slot is released when the body ends (before its end is
//! passed on) or is dropped (the client went away), and a refused request gets a 429 that
//! names the quota as concurrent requests.

use http::{Request, StatusCode};
use http_body_util::BodyExt;
use sluice_http::{PeerAddr, SharedLimitLayer};
use sluice_limiter::{LimitRequest, Limiter, RequestDescriptor};
use sluice_testing::limiter;
use tower::{Layer, ServiceExt};

const RULES: &str = r#"
domain: app
descriptors:
  - key: client_ip
    rate_limit: {name: in_flight, concurrency: 2}
routes:
  - path: /work
    descriptors: [[{key: client_ip, from: client_ip}]]
"#;

fn request() -> Request<String> {
    let mut r = Request::get("/work").body(String::new()).unwrap();
    r.extensions_mut()
        .insert(PeerAddr("127.0.0.1:1".parse().unwrap()));
    r
}

/// The slots free for the client, by a check, which takes none.
async fn free(limiter: &Limiter) -> u64 {
    let look = LimitRequest {
        domain: "app".into(),
        descriptors: vec![RequestDescriptor::new([("client_ip", "127.0.0.1")])],
        cost: 1,
    };
    limiter.decide(&look).await.unwrap().limits[0]
        .decision
        .remaining
}

#[tokio::test]
async fn a_slot_is_held_while_the_answer_lives() {
    let (limiter, _clock, _dir) = limiter(RULES);
    let inner = tower::service_fn(|_: Request<String>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(String::from("done")))
    });
    let service = SharedLimitLayer::new(limiter.clone()).layer(inner);

    let first = service.clone().oneshot(request()).await.unwrap();
    let second = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(free(&limiter).await, 0);
    let refused = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.headers()["ratelimit-policy"],
        r#""in_flight";q=2;qu="concurrent-requests""#
    );

    // Read to its end: released before the end is handed over.
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"done");
    assert_eq!(free(&limiter).await, 1);

    // Dropped unread: released in a task of its own.
    drop(second);
    for _ in 0..1_000 {
        if free(&limiter).await == 2 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        free(&limiter).await,
        2,
        "the dropped answer's slot came back"
    );
    let again = service.oneshot(request()).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
}
