//! A listener's HTTP/1.1 connections over real sockets, as a client writes them byte by byte:
//! the requests its own connection serves (kept alive, pipelined, a body that arrives after its
//! head, `Connection: close`, a streamed answer, a 204, a client that leaves) and those it
//! hands to hyper on the same connection (a chunked body, `Expect: 100-continue`, HTTP/1.0, a
//! head too long for it), each answered as a client expects.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use sluice_http::RequestBody;
use sluice_http::serve::{ConnectionLimits, serve_connections};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};

type Answer = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// What the test service saw of its requests, and whether an answer in the making was dropped.
#[derive(Default)]
struct Seen {
    dropped: AtomicUsize,
    started: Notify,
}

/// Answers `/echo` with the method, target, `x-echo` and the body; `/stream` with three parts,
/// unsized; `/large` with one part of 200 KiB, unsized; `/empty` with 204; `/never` never (it waits for ever, and counts its drop).
async fn answer(
    request: Request<RequestBody>,
    seen: Arc<Seen>,
) -> Result<Response<Answer>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let full = |s: String| Full::new(Bytes::from(s)).boxed();
    Ok(match parts.uri.path() {
        "/stream" => {
            let parts = ["one ", "two ", "three"].map(|p| {
                Ok::<_, Infallible>(http_body::Frame::data(Bytes::from_static(p.as_bytes())))
            });
            Response::new(StreamBody::new(futures_util::stream::iter(parts)).boxed())
        }
        "/large" => {
            let part = Bytes::from(vec![b'x'; 200 * 1024]);
            let parts = [Ok::<_, Infallible>(http_body::Frame::data(part))];
            Response::new(StreamBody::new(futures_util::stream::iter(parts)).boxed())
        }
        "/empty" => Response::builder()
            .status(StatusCode::NO_CONTENT)
            .body(full(String::new()))
            .unwrap(),
        "/never" => {
            struct Counted(Arc<Seen>);
            impl Drop for Counted {
                fn drop(&mut self) {
                    self.0.dropped.fetch_add(1, Ordering::SeqCst);
                }
            }
            let _counted = Counted(seen.clone());
            seen.started.notify_one();
            std::future::pending::<()>().await;
            unreachable!()
        }
        _ => {
            let echo = parts
                .headers
                .get("x-echo")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            Response::new(full(format!(
                "{} {} {:?} {echo} {}",
                parts.method,
                parts.uri,
                parts.version,
                String::from_utf8_lossy(&body)
            )))
        }
    })
}

struct Listener {
    addr: std::net::SocketAddr,
    seen: Arc<Seen>,
    stop: watch::Sender<bool>,
}

async fn listen() -> Listener {
    listen_with(ConnectionLimits::default()).await
}

async fn listen_with(limits: ConnectionLimits) -> Listener {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let for_service = seen.clone();
    let service = tower::service_fn(move |request| answer(request, for_service.clone()));
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(serve_connections(listener, service, stopped, limits));
    Listener { addr, seen, stop }
}

/// One answer read off `stream`: its head and its body, framed by length or chunks.
async fn read_answer(stream: &mut TcpStream, buf: &mut Vec<u8>) -> (String, String) {
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        read_more(stream, buf).await;
    };
    let head = String::from_utf8(buf.drain(..head_end).collect()).unwrap();
    let lower = head.to_ascii_lowercase();
    let body = if let Some(at) = lower.find("content-length: ") {
        let len: usize = lower[at + 16..]
            .split("\r\n")
            .next()
            .unwrap()
            .parse()
            .unwrap();
        while buf.len() < len {
            read_more(stream, buf).await;
        }
        buf.drain(..len).collect()
    } else if lower.contains("transfer-encoding: chunked") {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(at) = buf.windows(2).position(|w| w == b"\r\n") {
                    break at;
                }
                read_more(stream, buf).await;
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&buf[..line_end]).unwrap(), 16).unwrap();
            while buf.len() < line_end + 2 + size + 2 {
                read_more(stream, buf).await;
            }
            body.extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
            buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break body;
            }
        }
    } else {
        Vec::new()
    };
    (head, String::from_utf8(body).unwrap())
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) {
    let mut chunk = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    assert!(
        n > 0,
        "the connection closed; read so far: {:?}",
        String::from_utf8_lossy(buf)
    );
    buf.extend_from_slice(&chunk[..n]);
}

/// Whether the server closes the connection (reads to its end) within 10 s.
async fn closed(stream: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    matches!(
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await,
        Ok(Ok(_))
    )
}

#[tokio::test]
async fn kept_alive_and_pipelined_requests_are_answered_in_order() {
    let l = listen().await;
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    let mut buf = Vec::new();
    s.write_all(b"GET /echo?a=1 HTTP/1.1\r\nHost: x\r\nX-Echo: first\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = read_answer(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("date: "), "{head}");
    assert_eq!(body, "GET /echo?a=1 HTTP/1.1 first ");
    // Three at once, the last with a body: each answered, in order, on the same connection.
    s.write_all(
        b"GET /echo HTTP/1.1\r\nX-Echo: 2\r\n\r\nGET /stream HTTP/1.1\r\n\r\nPOST /echo HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody",
    )
    .await
    .unwrap();
    assert_eq!(
        read_answer(&mut s, &mut buf).await.1,
        "GET /echo HTTP/1.1 2 "
    );
    let (head, body) = read_answer(&mut s, &mut buf).await;
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert_eq!(body, "one two three");
    assert_eq!(
        read_answer(&mut s, &mut buf).await.1,
        "POST /echo HTTP/1.1  body"
    );
}

#[tokio::test]
async fn a_request_written_in_pieces_is_answered_whole() {
    let l = listen().await;
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    let mut buf = Vec::new();
    let wire = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello world";
    // The head in two pieces, then the body in two: a client that writes as it goes.
    for piece in [&wire[..10], &wire[10..40], &wire[40..50], &wire[50..]] {
        s.write_all(piece).await.unwrap();
        s.flush().await.unwrap();
        tokio::task::yield_now().await;
    }
    let (head, body) = read_answer(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, "POST /echo HTTP/1.1  hello world");
}

#[tokio::test]
async fn connection_close_is_answered_and_the_connection_closed() {
    let l = listen().await;
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    let mut buf = Vec::new();
    s.write_all(b"GET /echo HTTP/1.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (head, _) = read_answer(&mut s, &mut buf).await;
    assert!(head.contains("connection: close"), "{head}");
    assert!(closed(&mut s).await, "closed after the answer");
}

#[tokio::test]
async fn a_204_has_no_body_and_the_connection_goes_on() {
    let l = listen().await;
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    let mut buf = Vec::new();
    s.write_all(b"GET /empty HTTP/1.1\r\n\r\nGET /echo HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = read_answer(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 204 No Content\r\n"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    assert!(!head.contains("transfer-encoding"), "{head}");
    assert_eq!(body, "");
    assert_eq!(
        read_answer(&mut s, &mut buf).await.1,
        "GET /echo HTTP/1.1  "
    );
}

#[tokio::test]
async fn a_client_that_leaves_has_its_answer_dropped() {
    let l = listen().await;
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    let started = l.seen.started.notified();
    s.write_all(b"GET /never HTTP/1.1\r\n\r\n").await.unwrap();
    started.await;
    drop(s);
    sluice_test_support::eventually("the answer in the making is dropped", || async {
        l.seen.dropped.load(Ordering::SeqCst) == 1
    })
    .await;
}

#[tokio::test]
async fn requests_it_does_not_serve_itself_are_hyper_s_on_the_same_connection() {
    let l = listen().await;
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    let mut buf = Vec::new();
    // A served request first, then a chunked body, which hyper takes with the rest of the
    // connection: both answered, and a plain request after it too.
    s.write_all(b"GET /echo HTTP/1.1\r\nX-Echo: own\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(
        read_answer(&mut s, &mut buf).await.1,
        "GET /echo HTTP/1.1 own "
    );
    s.write_all(
        b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    assert_eq!(
        read_answer(&mut s, &mut buf).await.1,
        "POST /echo HTTP/1.1  hello world"
    );
    s.write_all(b"GET /echo HTTP/1.1\r\nX-Echo: after\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(
        read_answer(&mut s, &mut buf).await.1,
        "GET /echo HTTP/1.1 after "
    );

    // `Expect: 100-continue`: the interim answer first, then the body is sent and answered.
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    let mut buf = Vec::new();
    s.write_all(b"POST /echo HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
        .await
        .unwrap();
    let (interim, _) = read_answer(&mut s, &mut buf).await;
    assert!(interim.starts_with("HTTP/1.1 100 Continue"), "{interim}");
    s.write_all(b"ok").await.unwrap();
    assert_eq!(
        read_answer(&mut s, &mut buf).await.1,
        "POST /echo HTTP/1.1  ok"
    );

    // HTTP/1.0: answered as 1.0, and closed after.
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    let mut buf = Vec::new();
    s.write_all(b"GET /echo HTTP/1.0\r\n\r\n").await.unwrap();
    let (head, body) = read_answer(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    assert_eq!(body, "GET /echo HTTP/1.0  ");
    assert!(closed(&mut s).await);

    // A head longer than this connection reads itself, within hyper's bound: served.
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    let mut buf = Vec::new();
    let long = format!(
        "GET /echo HTTP/1.1\r\nX-Echo: {}\r\n\r\n",
        "a".repeat(sluice_http::h1_server::MAX_HEAD + 100)
    );
    s.write_all(long.as_bytes()).await.unwrap();
    let (head, body) = read_answer(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.ends_with(&format!("{} ", "a".repeat(100))));

    // A head hyper refuses is refused as hyper does, with 400.
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    let mut buf = Vec::new();
    s.write_all(b"GET /echo HTTP/1.1\r\nBad Field: 1\r\n\r\n")
        .await
        .unwrap();
    let (head, _) = read_answer(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
}

#[tokio::test]
async fn a_request_whose_body_is_arriving_when_the_listener_stops_is_answered() {
    // No drain: the connection is closed gracefully as soon as the stop is seen.
    let l = listen_with(ConnectionLimits {
        drain: Duration::ZERO,
        ..ConnectionLimits::default()
    })
    .await;
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    let mut buf = Vec::new();
    // One write: once the first is answered, the second's head and half its body have been
    // read with it.
    s.write_all(b"GET /echo HTTP/1.1\r\n\r\nPOST /echo HTTP/1.1\r\nContent-Length: 4\r\n\r\nha")
        .await
        .unwrap();
    read_answer(&mut s, &mut buf).await;
    l.stop.send(true).unwrap();
    s.write_all(b"lf").await.unwrap();
    let (head, body) = read_answer(&mut s, &mut buf).await;
    assert!(head.contains("connection: close"), "{head}");
    assert_eq!(body, "POST /echo HTTP/1.1  half");
    assert!(closed(&mut s).await);
}

#[tokio::test]
async fn a_large_body_is_sent_whole_and_the_connection_goes_on() {
    let l = listen().await;
    let mut s = TcpStream::connect(l.addr).await.unwrap();
    let mut buf = Vec::new();
    // 200 KiB in one part, chunked since the stream's size is not known.
    s.write_all(b"GET /large HTTP/1.1\r\n\r\nGET /echo HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = read_answer(&mut s, &mut buf).await;
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert_eq!(body.len(), 200 * 1024);
    assert!(body.bytes().all(|b| b == b'x'));
    assert_eq!(
        read_answer(&mut s, &mut buf).await.1,
        "GET /echo HTTP/1.1  "
    );
}
