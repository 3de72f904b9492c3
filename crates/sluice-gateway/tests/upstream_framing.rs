//! The gateway's HTTP/1.1 client against an upstream that writes exact bytes: every way an
//! answer's body can be framed reaches the client whole, and a connection is reused only when
//! its answer was read to the end and allowed it.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sluice_gateway::GatewayOptions;
use sluice_testing::{header, limiter};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const RULES: &str = r#"
domain: gw
descriptors:
  - key: client_ip
    rate_limit: {unit: minute, requests_per_unit: 1000}
routes:
  - path: /*
    descriptors: [[{key: client_ip, from: client_ip}]]
"#;

/// What the upstream does with the next request it reads, on whichever connection.
#[derive(Clone)]
enum Act {
    /// Writes these bytes and waits for the next request.
    Answer(Vec<u8>),
    /// Writes these bytes and closes the connection.
    AnswerAndClose(Vec<u8>),
    /// Closes the connection without answering.
    Close,
    /// Never answers; waits for the gateway to close the connection.
    Silent,
}

fn answer(wire: &str) -> Act {
    Act::Answer(wire.as_bytes().to_vec())
}

/// An upstream that follows a script, one act per request, and records the connections it
/// accepted and the request heads it read.
struct Scripted {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Scripted {
    async fn start(script: Vec<Act>) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        let (count, seen) = (accepted.clone(), heads.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, script.clone(), seen.clone()));
            }
        });
        Scripted {
            addr,
            accepted,
            heads,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// Reads requests (a head and its `Content-Length` body) and acts on each as the script says.
async fn serve(
    mut stream: TcpStream,
    script: Arc<Mutex<VecDeque<Act>>>,
    heads: Arc<Mutex<Vec<String>>>,
) {
    let mut buf = Vec::new();
    loop {
        let end = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .map_or(0, |n| n.trim().parse().unwrap());
        // A chunked body is read to its last chunk (the tests send no trailers).
        let chunked = head.contains("transfer-encoding: chunked");
        let body_end = |buf: &[u8]| {
            if chunked {
                buf[end..]
                    .windows(5)
                    .position(|w| w == b"0\r\n\r\n")
                    .map(|at| end + at + 5)
            } else {
                (buf.len() >= end + length).then_some(end + length)
            }
        };
        let body_end = loop {
            if let Some(at) = body_end(&buf) {
                break at;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        buf.drain(..body_end);
        heads.lock().unwrap().push(head);
        let act = script
            .lock()
            .unwrap()
            .pop_front()
            .expect("a request the script has no act for");
        match act {
            Act::Answer(bytes) => {
                if stream.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Act::AnswerAndClose(bytes) => {
                let _ = stream.write_all(&bytes).await;
                return;
            }
            Act::Close => return,
            Act::Silent => {
                let _ = stream.read(&mut [0u8; 1]).await;
                return;
            }
        }
    }
}

struct Gateway {
    proxy: sluice_gateway::Gateway,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Gateway {
    async fn start(upstream: SocketAddr) -> Gateway {
        Gateway::start_with(upstream, |_| {}).await
    }

    async fn start_with(upstream: SocketAddr, tune: impl FnOnce(&mut GatewayOptions)) -> Gateway {
        let (limiter, _clock, dir) = limiter(RULES);
        let mut options =
            GatewayOptions::new(Vec::new(), format!("http://{upstream}").parse().unwrap());
        options.listen = "127.0.0.1:0".parse().unwrap();
        tune(&mut options);
        let proxy = sluice_gateway::Gateway::start_with_limiter(options, limiter)
            .await
            .unwrap();
        Gateway {
            proxy,
            client: reqwest::Client::new(),
            _dir: dir,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.proxy.local_addr())
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.client.get(self.url(path)).send().await.unwrap()
    }
}

#[tokio::test]
async fn every_framing_reaches_the_client_whole_on_one_kept_connection() {
    let big = "x".repeat(300_000);
    let chunked_big: String = (0..20)
        .map(|i| {
            format!(
                "3e80\r\n{}\r\n",
                char::from(b'a' + i).to_string().repeat(16_000)
            )
        })
        .collect();
    let up = Scripted::start(vec![
        answer("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Up: 1\r\n\r\nhello"),
        answer(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
             5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: t\r\n\r\n",
        ),
        answer(
            "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n\
             HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nafter",
        ),
        answer("HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n"),
        answer("HTTP/1.1 204 No Content\r\n\r\n"),
        answer("HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\n\r\n"),
        answer(&format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{big}",
            big.len()
        )),
        answer(&format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{chunked_big}0\r\n\r\n"
        )),
        answer("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlast"),
    ])
    .await;
    let gw = Gateway::start(up.addr).await;

    let r = gw.get("/length?q=1").await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-up").as_deref(), Some("1"));
    assert_eq!(r.text().await.unwrap(), "hello");

    let r = gw.get("/chunked").await;
    assert_eq!(r.text().await.unwrap(), "hello world");

    let r = gw.get("/interim").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "after");

    let r = gw.client.head(gw.url("/head")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-length").as_deref(), Some("7"));
    assert_eq!(r.text().await.unwrap(), "");

    let r = gw.get("/no-content").await;
    assert_eq!(r.status(), 204);
    assert_eq!(r.text().await.unwrap(), "");

    let r = gw.get("/not-modified").await;
    assert_eq!(r.status(), 304);
    assert_eq!(header(&r, "etag").as_deref(), Some("\"v1\""));

    let r = gw.get("/big").await;
    assert_eq!(r.text().await.unwrap(), big);

    let r = gw.get("/chunked-big").await;
    let body = r.text().await.unwrap();
    assert_eq!(body.len(), 20 * 16_000);
    assert!(body.starts_with('a') && body.ends_with('t'));

    let r = gw.get("/last").await;
    assert_eq!(r.text().await.unwrap(), "last");
    assert_eq!(
        up.accepted(),
        1,
        "every answer was read to its end and allowed reuse"
    );

    let heads = up.heads();
    assert!(
        heads[0].starts_with("GET /length?q=1 HTTP/1.1\r\n"),
        "{}",
        heads[0]
    );
    assert!(
        heads[0].contains("\r\nx-forwarded-for: 127.0.0.1\r\n"),
        "{}",
        heads[0]
    );
    assert!(
        heads[3].starts_with("HEAD /head HTTP/1.1\r\n"),
        "{}",
        heads[3]
    );
}

#[tokio::test]
async fn a_connection_whose_answer_forbids_reuse_is_not_reused() {
    let up = Scripted::start(vec![
        // Delimited by the close.
        Act::AnswerAndClose(b"HTTP/1.1 200 OK\r\n\r\nuntil the end".to_vec()),
        // Says so.
        answer("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"),
        // HTTP/1.0 without keep-alive.
        answer("HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nold"),
        // Chunks and a length at once: the chunks win, and the connection is not trusted.
        answer(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 99\r\n\r\n\
             4\r\nboth\r\n0\r\n\r\n",
        ),
        // More than the length said: what follows is not an answer to anything.
        answer("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA"),
        answer("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlast"),
    ])
    .await;
    let gw = Gateway::start(up.addr).await;
    for (path, body) in [
        ("/close-delimited", "until the end"),
        ("/connection-close", "ok"),
        ("/http10", "old"),
        ("/both", "both"),
        ("/extra", "ok"),
        ("/last", "last"),
    ] {
        let r = gw.get(path).await;
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.text().await.unwrap(), body, "{path}");
    }
    assert_eq!(up.accepted(), 6, "each answer but the last forbade reuse");
}

#[tokio::test]
async fn a_reused_connection_that_ends_unanswered_is_sent_again_only_when_idempotent() {
    let ok = || answer("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    let up = Scripted::start(vec![ok(), Act::Close, ok(), Act::Close, ok()]).await;
    let gw = Gateway::start(up.addr).await;
    assert_eq!(gw.get("/first").await.text().await.unwrap(), "ok");

    // The kept connection ends as the GET arrives: sent again on a new one.
    let r = gw.get("/again").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "ok");
    assert_eq!(up.accepted(), 2);

    // The same for a POST: the upstream may have acted on it, so it is not sent again.
    let r = gw.client.post(gw.url("/once")).send().await.unwrap();
    assert_eq!(r.status(), 502);
    assert!(r.text().await.unwrap().contains("closed the connection"));
    let posts = up.heads().iter().filter(|h| h.starts_with("POST")).count();
    assert_eq!(posts, 1, "the POST reached the upstream once");

    // A new connection serves what follows.
    assert_eq!(gw.get("/after").await.text().await.unwrap(), "ok");
    assert_eq!(up.accepted(), 3);
}

#[tokio::test]
async fn an_idle_connection_the_upstream_closed_is_skipped() {
    let up = Scripted::start(vec![
        Act::AnswerAndClose(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec()),
        answer("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"),
    ])
    .await;
    let gw = Gateway::start(up.addr).await;
    assert_eq!(gw.get("/first").await.text().await.unwrap(), "ok");
    // A POST is not sent again: it succeeds only because the closed connection is not taken
    // (or, if the close is not seen yet, because nothing of it was accepted).
    let r = gw.client.post(gw.url("/next")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "next");
    assert_eq!(up.accepted(), 2);
}

#[tokio::test]
async fn a_cut_or_invalid_answer_fails_without_reuse() {
    let up = Scripted::start(vec![
        Act::AnswerAndClose(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc".to_vec()),
        Act::AnswerAndClose(b"not http at all\r\n\r\n".to_vec()),
        answer("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
    ])
    .await;
    let gw = Gateway::start(up.addr).await;
    // The client's connection is closed: before the head reached it, or midway through the
    // body; never a whole answer.
    match gw.client.get(gw.url("/cut")).send().await {
        Ok(r) => assert!(r.bytes().await.is_err(), "the body was cut short"),
        Err(e) => assert!(!e.is_timeout(), "{e}"),
    }

    let r = gw.get("/invalid").await;
    assert_eq!(r.status(), 502);
    assert!(r.text().await.unwrap().contains("invalid answer"));

    assert_eq!(gw.get("/fine").await.text().await.unwrap(), "ok");
    assert_eq!(up.accepted(), 3);
}

#[tokio::test]
async fn a_short_request_body_goes_on_the_kept_connection_framed_by_its_length() {
    let ok = || answer("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    let up = Scripted::start(vec![ok(), ok(), ok()]).await;
    let gw = Gateway::start(up.addr).await;
    assert_eq!(gw.get("/first").await.text().await.unwrap(), "ok");
    let r = gw
        .client
        .post(gw.url("/json"))
        .header("content-type", "application/json")
        .body(r#"{"a":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "ok");
    // A body of unknown length streams through hyper's client, on a connection of its own.
    let stream =
        futures_util::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"abc"))]);
    let r = gw
        .client
        .post(gw.url("/upload"))
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "ok");
    assert_eq!(
        up.accepted(),
        2,
        "the short body shared the kept connection; the stream had its own"
    );
    let heads = up.heads();
    assert!(
        heads[1].starts_with("POST /json HTTP/1.1\r\n")
            && heads[1].contains("content-length: 7\r\n"),
        "{}",
        heads[1]
    );
    assert!(
        heads[2].contains("transfer-encoding: chunked\r\n"),
        "{}",
        heads[2]
    );
}

#[tokio::test]
async fn a_kept_connection_times_out_like_a_new_one_and_is_not_reused() {
    let ok = || answer("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    let up = Scripted::start(vec![ok(), ok(), Act::Silent, ok()]).await;
    let gw = Gateway::start_with(up.addr, |o| {
        o.upstream_timeout = std::time::Duration::from_millis(200);
    })
    .await;
    // Two exchanges move the connection's timer on; the third, on the same connection, still
    // runs out.
    for path in ["/first", "/second"] {
        assert_eq!(gw.get(path).await.text().await.unwrap(), "ok");
    }
    let r = gw.get("/silent").await;
    assert_eq!(r.status(), 504);
    assert!(r.text().await.unwrap().contains("did not answer in time"));
    assert_eq!(up.accepted(), 1);
    assert_eq!(gw.get("/after").await.text().await.unwrap(), "ok");
    assert_eq!(up.accepted(), 2, "the connection that timed out was closed");
}
