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
