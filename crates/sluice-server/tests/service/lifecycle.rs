//! Starting and stopping: a graceful shutdown closes both listeners, and rules that do not load
//! stop the start with their location.

use std::time::Duration;

use serde_json::json;
use sluice_server::{ServeOptions, Server};
use sluice_test_support::rules_file;

use crate::harness::Harness;

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

/// 100 kept-alive clients of the HTTP API each send a `POST /json` as the service stops: every
/// one is answered (a request that may consume quota cannot be safely sent again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_answers_every_request_sent_on_a_kept_alive_connection() {
    let h = Harness::start().await;
    let addr = h.server.http_addr();
    let body = r#"{"domain":"shop","descriptors":[{"entries":[{"key":"health","value":"a"}]}]}"#;
    let post: &'static [u8] = format!(
        "POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
    .leak();
    let (unanswered, statuses) =
        sluice_testing::stopping::sent_while_stopping(addr, 100, post, h.server.shutdown()).await;
    assert_eq!(unanswered, 0, "of 100 requests sent while stopping");
    assert!(
        statuses.iter().all(|s| s == "http/1.1 200 ok"),
        "{statuses:?}"
    );
}

#[tokio::test]
async fn invalid_rules_stop_the_start_with_their_location() {
    let (path, _dir) = rules_file(
        "bad.yaml",
        "domain: x\ndescriptors:\n  - key: a\n    rate_limt: {unit: second, requests_per_unit: 1}\n",
    );
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
