//! Kept-alive HTTP/1.1 clients that each send one more request as a service stops: how a test
//! holds a listener to answering every request already sent when it stops, on any listener
//! (the lifecycle's own, the service's HTTP API, the gateway's).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long each answer is waited for.
const BOUND: Duration = Duration::from_secs(20);

/// Opens `clients` connections to `addr` and sends `request` (a whole HTTP/1.1 request) on
/// each, reading its answer; then starts `stop` (as a task) and at once sends `request` again
/// on every connection. Returns how many of those were left without an answer (the connection
/// ended, or was reset, first) and the answers' status lines, once `stop` has ended.
pub async fn sent_while_stopping(
    addr: SocketAddr,
    clients: usize,
    request: &'static [u8],
    stop: impl Future<Output = ()> + Send + 'static,
) -> (usize, Vec<String>) {
    let mut connections = Vec::with_capacity(clients);
    for _ in 0..clients {
        let mut connection = TcpStream::connect(addr).await.unwrap();
        connection.write_all(request).await.unwrap();
        let answer = tokio::time::timeout(BOUND, answer(&mut connection)).await;
        assert!(
            answer.is_ok_and(|a| a.is_some()),
            "no answer before the stop"
        );
        connections.push(connection);
    }
    let stopping = tokio::spawn(stop);
    let answers: Vec<_> = connections
        .into_iter()
        .map(|mut connection| {
            tokio::spawn(async move {
                // A reset (the connection closed under the request) reads as no answer.
                let _ = connection.write_all(request).await;
                answer(&mut connection).await
            })
        })
        .collect();
    let (mut unanswered, mut statuses) = (0, Vec::new());
    for answer in answers {
        match tokio::time::timeout(BOUND, answer).await {
            Ok(Ok(Some(status))) => statuses.push(status),
            Ok(Ok(None)) => unanswered += 1,
            other => panic!("an answer never came nor the connection's end: {other:?}"),
        }
    }
    tokio::time::timeout(BOUND, stopping)
        .await
        .expect("still stopping")
        .unwrap();
    (unanswered, statuses)
}

/// One whole answer from `connection` (its head, and its body by `content-length` or to the
/// end of its chunks); its status line, or `None` if the connection ended or failed first.
async fn answer(connection: &mut TcpStream) -> Option<String> {
    let mut got = Vec::new();
    let mut chunk = [0; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let body = &got[end + 4..];
            let whole = match head.lines().find_map(|l| l.strip_prefix("content-length:")) {
                Some(len) => body.len() >= len.trim().parse::<usize>().ok()?,
                None => body.ends_with(b"0\r\n\r\n"),
            };
            if whole {
                return head.lines().next().map(str::to_owned);
            }
        }
        match connection.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
        }
    }
}
