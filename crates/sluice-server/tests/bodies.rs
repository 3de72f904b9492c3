//! Bodies that cannot be read, over a raw socket: a broken chunked encoding is the client's
//! error (400), only an oversized body is too large (413).

use std::sync::Arc;

use sluice_core::MemoryStore;
use sluice_server::{ServeOptions, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn start() -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap();
    let mut options = ServeOptions::new(vec![rules]);
    options.http_addr = "127.0.0.1:0".parse().unwrap();
    options.grpc_addr = "127.0.0.1:0".parse().unwrap();
    let server = Server::start_with_store(options, Arc::new(MemoryStore::new()))
        .await
        .unwrap();
    (server, dir)
}

/// The status line of the answer to `raw`.
async fn status_of(server: &Server, raw: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(server.http_addr())
        .await
        .unwrap();
    s.write_all(raw).await.unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    text.lines().next().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_broken_chunked_body_is_a_bad_request_and_a_huge_one_too_large() {
    let (server, _dir) = start().await;
    for path in ["/json", "/v1/check"] {
        let broken = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\n\r\n5\r\n{{\"dom\r\nZZ\r\nnot hex\r\n0\r\n\r\n"
        );
        assert_eq!(
            status_of(&server, broken.as_bytes()).await,
            "HTTP/1.1 400 Bad Request",
            "{path}"
        );
        let huge = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n\
             Content-Length: 10000000\r\n\r\n{}",
            "x".repeat(1 << 20)
        );
        assert_eq!(
            status_of(&server, huge.as_bytes()).await,
            "HTTP/1.1 413 Payload Too Large",
            "{path}"
        );
    }
    server.shutdown().await;
}
