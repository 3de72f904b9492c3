//! `--send-timeout` on a real `sluice serve`: a client that sends 2,000 pipelined `GET /metrics`
//! and never reads the answers is dropped once the server's writes have made no progress for
//! the timeout, seen from outside as the server's socket leaving `/proc/PID/fd`. Before, the
//! connection and the answers not yet written were held for as long as the client stayed.

use std::time::Duration;

use sluice_test_support::{ServeProcess, eventually_within, rules_file};
use tokio::io::AsyncWriteExt;

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/fd: {e}"))
        .count()
}

#[tokio::test]
async fn a_client_that_never_reads_is_dropped_at_the_send_timeout() {
    let (rules, _dir) = rules_file("rules.yaml", RULES);
    let serve = ServeProcess::builder(env!("CARGO_BIN_EXE_sluice"))
        .config(&rules)
        .args(["--send-timeout", "1s", "--header-timeout", "1h"])
        .args(["--idle-timeout", "1h"])
        .start();
    let pid = serve.pid();
    let within = Duration::from_secs(20);
    // The listener's readiness probe may still be closing: settle on a count first.
    let before = eventually_within("a steady count of descriptors", within, || async {
        let first = open_descriptors(pid);
        (open_descriptors(pid) == first).then_some(first)
    })
    .await;

    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    // A small receive buffer, so that the answers back up into the server at once.
    socket.set_recv_buffer_size(4_096).unwrap();
    let client = socket.connect(serve.http().parse().unwrap()).await.unwrap();
    let (_unread, mut writer) = client.into_split();
    // The server stops reading once its answers back up, so the writes may block: they run
    // beside the test, and fail once the server has dropped the connection.
    let sending = tokio::spawn(async move {
        let requests = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(2_000);
        let _ = writer.write_all(&requests).await;
    });
    eventually_within("the connection accepted", within, || async {
        open_descriptors(pid) > before
    })
    .await;
    eventually_within(
        "the connection dropped at the 1 s send timeout, nothing read",
        within,
        || async { open_descriptors(pid) <= before },
    )
    .await;
    sending.await.unwrap();
}
