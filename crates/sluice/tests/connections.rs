//! Stopping, slow clients and too many connections, with real processes: SIGTERM ends `serve`
//! and `proxy` within the shutdown deadline whatever the clients hold open, a client that
//! trickles its request head is disconnected while others are served, and one address cannot
//! hold more connections than its share.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use sluice_testing::process::{Spawned, free_addr, spawn_listening};

const RULES: &str = "domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
routes:
  - path: /api/*
    descriptors: [[{key: k, value: all}]]
";

fn rules() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, RULES).unwrap();
    let path = path.to_str().unwrap().to_owned();
    (dir, path)
}

/// `sluice serve` on `rules` with `extra` flags; returns it with its HTTP and gRPC addresses.
fn serve(rules: &str, extra: &[&str]) -> (Spawned, String, String) {
    let (http, grpc) = (free_addr(), free_addr());
    let mut args = vec![
        "serve",
        "--config",
        rules,
        "--http-addr",
        &http,
        "--grpc-addr",
        &grpc,
    ];
    args.extend_from_slice(extra);
    let process = spawn_listening(env!("CARGO_BIN_EXE_sluice"), &args, &http);
    (process, http, grpc)
}

/// Sends SIGTERM and waits, at most 20 s, for the process to exit.
fn terminate(process: &mut Spawned) -> ExitStatus {
    let pid = process.pid().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = process.0.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "still running 20 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A request whose head is sent but whose body never comes.
fn half_sent_request(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        .unwrap();
    s
}

/// An h2c connection that sends the preface and then nothing, as a stalled gRPC client.
fn silent_h2c(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    s
}

#[test]
fn serve_exits_zero_after_the_deadline_whatever_clients_hold_open() {
    let (_dir, rules) = rules();
    let (mut serve, http, grpc) = serve(
        &rules,
        &["--shutdown-timeout", "1s", "--header-timeout", "1h"],
    );
    let _held = [
        half_sent_request(&http),
        silent_h2c(&grpc),
        silent_h2c(&http),
    ];
    let status = terminate(&mut serve);
    assert!(status.success(), "{status}");
}

#[test]
fn proxy_exits_zero_after_the_deadline_whatever_clients_hold_open() {
    let (_dir, rules) = rules();
    let (listen, admin) = (free_addr(), free_addr());
    let mut proxy = spawn_listening(
        env!("CARGO_BIN_EXE_sluice"),
        &[
            "proxy",
            "--config",
            &rules,
            "--listen",
            &listen,
            "--admin-addr",
            &admin,
            "--upstream",
            "http://127.0.0.1:9",
            "--shutdown-timeout",
            "1s",
            "--header-timeout",
            "1h",
        ],
        // The admin listener binds after the proxy's: once it answers, both do.
        &admin,
    );
    let _held = [
        half_sent_request(&listen),
        silent_h2c(&listen),
        half_sent_request(&admin),
    ];
    let status = terminate(&mut proxy);
    assert!(status.success(), "{status}");
}

#[test]
fn a_trickled_request_head_is_cut_off_while_others_are_served() {
    let (_dir, rules) = rules();
    let (_serve, http, _grpc) = serve(&rules, &["--header-timeout", "1s"]);
    // A slowloris: the head is never finished.
    let mut slow = TcpStream::connect(&http).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: ")
        .unwrap();
    // Meanwhile a real client is answered.
    let mut ok = TcpStream::connect(&http).unwrap();
    ok.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    ok.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The slow one is closed by the server (end of stream, perhaps after a 408), not left open:
    // the read below would otherwise block until its own 20 s bound and fail.
    slow.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut rest = Vec::new();
    match slow.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
}

/// A GET /healthz on a new connection: `Some(status line)`, or `None` when the server closed
/// the connection without answering.
fn healthz(addr: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.lines().next().map(str::to_owned)
}

#[test]
fn one_address_cannot_hold_more_than_its_share_of_connections() {
    let (_dir, rules) = rules();
    let (_serve, http, _grpc) = serve(
        &rules,
        &["--header-timeout", "1h", "--max-connections-per-ip", "3"],
    );
    // spawn_listening's own probe connection has come and gone; wait until its place is back.
    let deadline = Instant::now() + Duration::from_secs(20);
    while healthz(&http).is_none() {
        assert!(Instant::now() < deadline, "the server never answered");
    }
    let mut idle: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&http).unwrap()).collect();
    // A fourth connection from the same address is closed unanswered.
    assert_eq!(healthz(&http), None);
    // One idle client leaves: its place comes back, and a request is answered again.
    idle.pop();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = healthz(&http) {
            assert!(status.starts_with("HTTP/1.1 200"), "{status}");
            break;
        }
        assert!(Instant::now() < deadline, "the freed place never came back");
    }
}
