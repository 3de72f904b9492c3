//! A concurrency limit at the gateway, end to end: a slow upstream on a loopback port whose
//! answers stream a first chunk and then wait until the test releases them, `sluice proxy` in
//! front with `concurrency: 2` on the route's descriptor, and a real HTTP client. Two answers
//! in flight pass, the third is refused with `qu="concurrent-requests"`, and a slot comes back
//! when an answer ends or its client goes away, on memory and on a real Redis.
//!
//! Nothing here sleeps: the upstream holds its answers until the test releases them, and what
//! happens after a client leaves waits on a condition with a deadline.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::get;
use futures_util::StreamExt;
use sluice_gateway::GatewayOptions;
use sluice_limiter::{LimitRequest, Limiter, RequestDescriptor};
use sluice_redis::testing::{shared_server, store_at_hour_start};
use sluice_test_support::eventually;
use sluice_testing::{header, limiter, limiter_with};
use tokio::sync::Semaphore;

const RULES: &str = r#"
domain: api
descriptors:
  - key: tenant
    rate_limit: {name: in_flight, concurrency: 2}
routes:
  - path: /slow
    descriptors: [[{key: tenant, from: "header:x-tenant"}]]
"#;

/// Answers a first chunk at once, then the rest when the test adds a permit.
async fn slow(State(release): State<Arc<Semaphore>>) -> impl IntoResponse {
    let stream = futures_util::stream::unfold(0u8, move |step| {
        let release = release.clone();
        async move {
            match step {
                0 => Some((Ok::<_, std::io::Error>(Bytes::from_static(b"first ")), 1)),
                1 => {
                    release.acquire().await.unwrap().forget();
                    Some((Ok(Bytes::from_static(b"last")), 2))
                }
                _ => None,
            }
        }
    });
    Body::from_stream(stream)
}

struct Harness {
    gateway: sluice_gateway::Gateway,
    limiter: Arc<Limiter>,
    release: Arc<Semaphore>,
    client: reqwest::Client,
    _rules: tempfile::TempDir,
}

impl Harness {
    async fn with(limiter: Arc<Limiter>, dir: tempfile::TempDir) -> Harness {
        let release = Arc::new(Semaphore::new(0));
        let app = Router::new()
            .route("/slow", get(slow))
            .with_state(release.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let mut options =
            GatewayOptions::new(Vec::new(), format!("http://{upstream}").parse().unwrap());
        options.listen = "127.0.0.1:0".parse().unwrap();
        let gateway = sluice_gateway::Gateway::start_with_limiter(options, limiter.clone())
            .await
            .unwrap();
        Harness {
            gateway,
            limiter,
            release,
            client: reqwest::Client::new(),
            _rules: dir,
        }
    }

    fn get(&self, tenant: &str) -> reqwest::RequestBuilder {
        self.client
            .get(format!("http://{}/slow", self.gateway.local_addr()))
            .header("x-tenant", tenant)
    }

    /// The slots free for `tenant`, by a check, which takes none.
    async fn free(&self, tenant: &str) -> u64 {
        let look = LimitRequest {
            domain: "api".into(),
            descriptors: vec![RequestDescriptor::new([("tenant", tenant)])],
            cost: 1,
        };
        self.limiter.decide(&look).await.unwrap().limits[0]
            .decision
            .remaining
    }
}

/// Two in flight pass; the third is refused as a concurrency quota; when one answer ends a
/// new request passes; a client that leaves mid-answer gives its slot back.
async fn two_in_flight(h: Harness, tenant: &str) {
    let first = h.get(tenant).send().await.unwrap();
    assert_eq!(first.status(), 200);
    let second = h.get(tenant).send().await.unwrap();
    assert_eq!(second.status(), 200);
    assert_eq!(h.free(tenant).await, 0);

    let refused = h.get(tenant).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    let policy = header(&refused, "ratelimit-policy");
    assert_eq!(
        policy.as_deref(),
        Some(r#""in_flight";q=2;qu="concurrent-requests""#)
    );
    assert_eq!(header(&refused, "retry-after").as_deref(), Some("1"));
    assert_eq!(
        header(&refused, "ratelimit").as_deref(),
        Some(r#""in_flight";r=0;t=300"#)
    );

    // The first answer ends: its slot is released before its end reaches the client.
    h.release.add_permits(1);
    assert_eq!(first.text().await.unwrap(), "first last");
    assert_eq!(h.free(tenant).await, 1);
    let third = h.get(tenant).send().await.unwrap();
    assert_eq!(third.status(), 200);
    assert_eq!(h.get(tenant).send().await.unwrap().status(), 429);

    // The second's client goes away mid-answer: its slot comes back without the answer ending.
    let mut body = second.bytes_stream();
    assert_eq!(&body.next().await.unwrap().unwrap()[..], b"first ");
    drop(body);
    eventually("the slot of a client that left comes back", || async {
        h.free(tenant).await == 1
    })
    .await;
    let fourth = h.get(tenant).send().await.unwrap();
    assert_eq!(fourth.status(), 200);
    h.release.add_permits(2);
    assert_eq!(third.text().await.unwrap(), "first last");
    assert_eq!(fourth.text().await.unwrap(), "first last");
    assert_eq!(h.free(tenant).await, 2);
}

#[tokio::test]
async fn two_in_flight_pass_the_third_waits_for_one_to_end() {
    let (limiter, _clock, dir) = limiter(RULES);
    two_in_flight(Harness::with(limiter, dir).await, "acme").await;
}

#[tokio::test]
async fn on_redis_two_in_flight_pass_the_third_waits_for_one_to_end() {
    let store = store_at_hour_start(shared_server()).await;
    let (limiter, dir) = limiter_with(RULES, Arc::new(store));
    let tenant = format!("acme-{}", sluice_core::ReservationId::random());
    two_in_flight(Harness::with(limiter, dir).await, &tenant).await;
}
