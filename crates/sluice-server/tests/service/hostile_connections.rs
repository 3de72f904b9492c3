//! Clients that hold the listeners' connections without being served: a socket that sends
//! nothing, a byte, or the h2 preface and no request is closed at the header timeout on every
//! listener; an idle h2 connection that answers every ping is closed at the idle timeout; a
//! gRPC connection advertises its stream limit, and a stream whose message never ends is
//! answered `DEADLINE_EXCEEDED` at the header timeout. Timeouts are short and the waits for
//! each close bounded (10 s, far past every timeout configured here, far below the times the
//! listeners held such connections before).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::Harness;

/// How long a test waits for what must happen well within it.
const BOUND: Duration = Duration::from_secs(10);

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Waits at most [`BOUND`] for `what`, panicking with `doing` if it does not end in time.
async fn within<T>(doing: &str, what: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, what)
        .await
        .unwrap_or_else(|_| panic!("still {doing} after {BOUND:?}"))
}

/// An h2 connection to `addr`, driven by a task whose end (when the server closes it) is
/// returned.
async fn h2_client(
    addr: SocketAddr,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    (send, tokio::spawn(connection))
}

#[tokio::test]
async fn connections_that_send_no_request_are_closed_at_the_header_timeout_on_every_listener() {
    let h = Harness::start_with(|o| o.connections.header_read = Duration::from_millis(300)).await;
    let preface: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    for (listener, addr) in [
        ("HTTP", h.server.http_addr()),
        ("gRPC", h.server.grpc_addr()),
    ] {
        for sent in [&b""[..], b"P", b"PRI * HTTP/2.0", preface] {
            let mut socket = TcpStream::connect(addr).await.unwrap();
            socket.write_all(sent).await.unwrap();
            let doing = format!(
                "held open on the {listener} listener after {:?}",
                String::from_utf8_lossy(sent)
            );
            // The end of the stream, or a reset: either way closed.
            let mut read = Vec::new();
            let _ = within(&doing, socket.read_to_end(&mut read)).await;
        }
        // A real h2 client, which answers the server's SETTINGS and pings, but asks nothing.
        let (_send, connection) = h2_client(addr).await;
        let doing =
            format!("held open on the {listener} listener by an h2 client that asks nothing");
        let _ = within(&doing, connection).await;
    }
}

#[tokio::test]
async fn an_idle_h2_connection_that_answers_pings_is_closed_at_the_idle_timeout() {
    let h = Harness::start_with(|o| {
        o.connections.idle = Duration::from_millis(500);
        o.connections.h2_keep_alive = Duration::from_millis(100);
    })
    .await;
    for (listener, addr, method, path) in [
        ("HTTP", h.server.http_addr(), "GET", "/healthcheck"),
        (
            "gRPC",
            h.server.grpc_addr(),
            "POST",
            "/grpc.health.v1.Health/Check",
        ),
    ] {
        let (send, connection) = h2_client(addr).await;
        let mut send = send.ready().await.unwrap();
        let request = http::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (answer, mut body) = send.send_request(request, false).unwrap();
        // An empty `HealthCheckRequest`; the HTTP listener's health check ignores it.
        body.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true)
            .unwrap();
        let answer = within("waiting for an answer", answer).await.unwrap();
        assert!(answer.status().is_success(), "{listener}: {answer:?}");
        drop((send, answer));
        let doing = format!("held open on the {listener} listener, idle and answering pings");
        let ended = within(&doing, connection).await.unwrap();
        assert!(
            ended.is_ok(),
            "{listener}: closed with {ended:?}, not GOAWAY"
        );
    }
}

#[tokio::test]
async fn a_grpc_connection_caps_its_streams_and_a_message_that_never_ends_is_deadline_exceeded() {
    let h = Harness::start_with(|o| o.connections.header_read = Duration::from_millis(500)).await;
    let addr = h.server.grpc_addr();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, mut connection) = h2::client::handshake(tcp).await.unwrap();
    let mut send = send.ready().await.unwrap();
    let request = http::Request::post(format!("http://{addr}{SHOULD_RATE_LIMIT}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (answer, mut body) = send.send_request(request, false).unwrap();
    // A message of 10 bytes, of which none ever comes, nor the stream's end.
    body.send_data(Bytes::from_static(&[0, 0, 0, 0, 10]), false)
        .unwrap();
    let answer = within(
        "waiting for an answer to a message that never ends",
        async {
            tokio::select! {
                answer = answer => answer.unwrap(),
                ended = &mut connection => panic!("the connection ended first: {ended:?}"),
            }
        },
    )
    .await;
    assert_eq!(
        answer
            .headers()
            .get("grpc-status")
            .map(|v| v.to_str().unwrap()),
        Some("4"),
        "DEADLINE_EXCEEDED: {answer:?}"
    );
    assert_eq!(
        connection.max_concurrent_send_streams(),
        200,
        "the stream limit the server advertised"
    );
    drop(body);
}
