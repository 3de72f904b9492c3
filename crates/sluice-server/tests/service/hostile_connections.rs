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

/// An h2 client that asks and grants no flow-control window (while it answers every ping):
/// its answers' heads come, their bodies never can, and the connection is dropped at the send
/// timeout on both listeners. Before, it was held with the answers for as long as the client
/// stayed: they were in flight, so never idle.
#[tokio::test]
async fn an_h2_client_that_grants_no_window_is_dropped_at_the_send_timeout() {
    let h = Harness::start_with(|o| {
        o.connections.send = Duration::from_millis(500);
        o.connections.header_read = Duration::from_secs(60);
        o.connections.h2_keep_alive = Duration::from_millis(100);
        o.connections.idle = Duration::from_secs(60);
    })
    .await;
    for (listener, addr, path, body) in [
        ("HTTP", h.server.http_addr(), "/metrics", None),
        (
            "gRPC",
            h.server.grpc_addr(),
            "/grpc.health.v1.Health/Check",
            Some(Bytes::from_static(&[0, 0, 0, 0, 0])),
        ),
    ] {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(0)
            .handshake::<_, Bytes>(tcp)
            .await
            .unwrap();
        let connection = tokio::spawn(connection);
        let mut send = send.ready().await.unwrap();
        let method = if body.is_some() { "POST" } else { "GET" };
        let request = http::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (answer, mut stream) = send.send_request(request, body.is_none()).unwrap();
        if let Some(body) = body {
            stream.send_data(body, true).unwrap();
        }
        let answer = within(&format!("waiting for the {listener} answer's head"), answer)
            .await
            .unwrap();
        assert!(answer.status().is_success(), "{listener}: {answer:?}");
        let doing = format!("held open on the {listener} listener by a client granting no window");
        within(&doing, connection).await.unwrap().ok();
        drop((send, answer));
    }
}

/// An h2 frame: its header (length, type, flags, stream) and payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// After a first request, a client opens a second request's header block (`HEADERS` without
/// `END_HEADERS`) and trickles `CONTINUATION` frames that never end it: the connection is
/// closed at the header timeout, on both listeners (it was held until an unanswerable ping
/// timed out, 30 s by default, and here, with pings a minute apart, past the test's bound).
#[tokio::test]
async fn an_h2_header_block_trickled_in_continuation_frames_is_cut_at_the_header_timeout() {
    const HEADERS: u8 = 0x1;
    const CONTINUATION: u8 = 0x9;
    const END_STREAM_AND_HEADERS: u8 = 0x1 | 0x4;
    let h = Harness::start_with(|o| {
        o.connections.header_read = Duration::from_millis(300);
        o.connections.h2_keep_alive = Duration::from_secs(60);
        o.connections.idle = Duration::from_secs(60);
    })
    .await;
    for (listener, addr) in [
        ("HTTP", h.server.http_addr()),
        ("gRPC", h.server.grpc_addr()),
    ] {
        let mut socket = TcpStream::connect(addr).await.unwrap();
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        hello.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        // `GET / http` from HPACK's static table: a whole request, answered.
        hello.extend(frame(
            HEADERS,
            END_STREAM_AND_HEADERS,
            1,
            &[0x82, 0x84, 0x86],
        ));
        socket.write_all(&hello).await.unwrap();
        // Read the server's frames until the answer's HEADERS on stream 1.
        let mut answered = false;
        while !answered {
            let mut header = [0; 9];
            within(
                "waiting for the first answer",
                socket.read_exact(&mut header),
            )
            .await
            .unwrap();
            let len =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            let mut payload = vec![0; len];
            socket.read_exact(&mut payload).await.unwrap();
            answered = header[3] == HEADERS && header[5..9] == [0, 0, 0, 1];
        }
        let mut trickle = frame(HEADERS, 0, 3, &[0x82]);
        for field in [0x84, 0x86] {
            trickle.extend(frame(CONTINUATION, 0, 3, &[field]));
        }
        socket.write_all(&trickle).await.unwrap();
        let doing = format!("held open on the {listener} listener by a header block never ended");
        let mut rest = Vec::new();
        let _ = within(&doing, socket.read_to_end(&mut rest)).await;
    }
}
