//! `--send-timeout` on a real `sluice serve`: a client that sends 2,000 pipelined `GET /metrics`
//! and never reads the answers is dropped once the server's writes have made no progress for
//! the timeout, seen from outside as the server's end of that one connection leaving
//! `/proc/PID/fd`. Before, the connection and the answers not yet written were held for as long
//! as the client stayed.

use std::time::Duration;

use sluice_test_support::{ServeProcess, eventually_within, rules_file};
use tokio::io::AsyncWriteExt;

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

/// Whether `pid` holds the server's end of the TCP connection from `client` to `server`: its
/// socket's inode, found in `/proc/net/tcp` by the two ports, among the process's descriptors.
/// Counting descriptors instead races with the readiness probe's socket, which may close just
/// as the connection is accepted.
fn holds_connection(pid: u32, server: u16, client: u16) -> bool {
    let port = |address: &str| {
        address
            .rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let inodes: Vec<String> = tcp
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, remote, inode) = (fields.get(1)?, fields.get(2)?, fields.get(9)?);
            (port(local) == Some(server) && port(remote) == Some(client))
                .then(|| format!("socket:[{inode}]"))
        })
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|target| inodes.iter().any(|i| target.to_str() == Some(i.as_str())))
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
    let server: std::net::SocketAddr = serve.http().parse().unwrap();

    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    // A small receive buffer, so that the answers back up into the server at once.
    socket.set_recv_buffer_size(4_096).unwrap();
    let client = socket.connect(server).await.unwrap();
    let client_port = client.local_addr().unwrap().port();
    let (_unread, mut writer) = client.into_split();
    // The server stops reading once its answers back up, so the writes may block: they run
    // beside the test, and fail once the server has dropped the connection.
    let sending = tokio::spawn(async move {
        let requests = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(2_000);
        let _ = writer.write_all(&requests).await;
    });
    eventually_within("the connection accepted", within, || async {
        holds_connection(pid, server.port(), client_port)
    })
    .await;
    eventually_within(
        "the connection dropped at the 1 s send timeout, nothing read",
        within,
        || async { !holds_connection(pid, server.port(), client_port) },
    )
    .await;
    sending.await.unwrap();
}
