//! Stopping, slow clients and too many connections, with real processes: SIGTERM ends `serve`
//! and `proxy` within the shutdown deadline whatever the clients hold open, a client that
//! trickles its request head is disconnected while others are served, one address cannot
//! hold more connections than its share, 5,000 idle connections leave `serve` and `proxy`
//! answering, and running out of file descriptors pauses accepting, logged once in a while,
//! until connections close.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use sluice_test_support::{
    ServeProcess, Spawned, free_addr, rules_file, spawn_listening, wait_until, wait_within,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// 5 an hour, in a window that starts at the counter's first request: a window aligned to the
/// clock could end among the 20 requests of a crowd test and admit more than 5.
const RULES: &str = "domain: d
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 5, alignment: first_request}
routes:
  - path: /api/*
    descriptors: [[{key: k, value: all}]]
";

fn rules() -> (tempfile::TempDir, String) {
    let (path, dir) = rules_file("rules.yaml", RULES);
    let path = path.to_str().unwrap().to_owned();
    (dir, path)
}

/// `sluice serve` on `rules` with `extra` flags; returns it with its HTTP and gRPC addresses.
fn serve(rules: &str, extra: &[&str]) -> (ServeProcess, String, String) {
    let process = ServeProcess::builder(env!("CARGO_BIN_EXE_sluice"))
        .config(rules)
        .args(extra)
        .start();
    let (http, grpc) = (process.http().to_owned(), process.grpc().to_owned());
    (process, http, grpc)
}

/// `sluice proxy` on `rules` in front of `upstream` with `extra` flags; returns it with its
/// proxy and admin addresses.
fn proxy(rules: &str, upstream: &str, extra: &[&str]) -> (Spawned, String, String) {
    let (listen, admin) = (free_addr(), free_addr());
    let mut args = vec![
        "proxy",
        "--config",
        rules,
        "--listen",
        &listen,
        "--admin-addr",
        &admin,
        "--upstream",
        upstream,
    ];
    args.extend_from_slice(extra);
    // The admin listener binds after the proxy's: once it answers, both do.
    let process = spawn_listening(env!("CARGO_BIN_EXE_sluice"), &args, &admin);
    (process, listen, admin)
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
    let status = serve.terminate();
    assert!(status.success(), "{status}");
}

#[test]
fn proxy_exits_zero_after_the_deadline_whatever_clients_hold_open() {
    let (_dir, rules) = rules();
    let (mut proxy, listen, admin) = proxy(
        &rules,
        "http://127.0.0.1:9",
        &["--shutdown-timeout", "1s", "--header-timeout", "1h"],
    );
    let _held = [
        half_sent_request(&listen),
        silent_h2c(&listen),
        half_sent_request(&admin),
    ];
    let status = proxy.terminate();
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
    // The start's own probe connection has come and gone; wait until its place is back.
    wait_until("the server answers", || healthz(&http).is_some());
    // Three idle connections, then a fourth from the same address is closed unanswered. The
    // last answered connection's place comes back only once the server has finished with it,
    // which on a loaded machine can be after the client saw the answer: then one of the three
    // was the one refused, and the fourth is served. Try again: only a server that lets four
    // in every time fails.
    let mut idle = wait_until("a fourth connection from one address is refused", || {
        let idle: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&http).unwrap()).collect();
        healthz(&http).is_none().then_some(idle)
    });
    // One idle client leaves: its place comes back, and a request is answered again.
    idle.pop();
    let status = wait_until("the freed place comes back", || healthz(&http));
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
}

/// Whether an h2 connection to `addr` is served: the server answers the client's preface and
/// SETTINGS with a SETTINGS frame of its own, where a refused connection is closed unanswered.
fn h2_served(addr: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // an empty SETTINGS frame
    if s.write_all(&hello).is_err() {
        return false;
    }
    let mut head = [0u8; 9];
    s.read_exact(&mut head).is_ok() && head[3] == 4
}

/// The gRPC listener keeps one address to its share as the HTTP one does: a fourth connection
/// is closed before h2 starts, and a place given back is taken again.
#[test]
fn the_grpc_listener_holds_one_address_to_its_share_too() {
    let (_dir, rules) = rules();
    let (_serve, _http, grpc) = serve(&rules, &["--max-connections-per-ip", "3"]);
    // The start's own probe connection has come and gone; wait until its place is back.
    wait_until("the gRPC listener serves h2", || h2_served(&grpc));
    // As in the HTTP test above: a place given back late can let the fourth in once; only a
    // listener that lets four in every time fails.
    let mut idle = wait_until(
        "a fourth gRPC connection from one address is refused",
        || {
            let idle: Vec<TcpStream> = (0..3).map(|_| silent_h2c(&grpc)).collect();
            (!h2_served(&grpc)).then_some(idle)
        },
    );
    idle.pop();
    wait_until("the freed gRPC place comes back", || h2_served(&grpc));
}

/// How many idle connections the crowd tests hold.
const CROWD: usize = 5_000;
/// How many of them come from one source address: under `--max-connections-per-ip`'s default
/// of 1,024, which is kept, so the crowd comes from 127.0.0.2 to 127.0.0.6.
const PER_SOURCE: usize = 1_000;

/// Raises this process's open-files limit to its hard limit, and checks that the crowd fits in
/// it: this process holds the crowd (two at once when the `serve` and `proxy` tests overlap),
/// and a `sluice` process, which raises its own limit to the same hard limit, fits its
/// connection cap to (limit - 256) / 3.
fn room_for_the_crowd() {
    let soft = rlimit::increase_nofile_limit(u64::MAX).expect("the open-files limit");
    let needed = (3 * CROWD + 256) as u64;
    assert!(
        soft >= needed,
        "the crowd tests need an open-files hard limit of at least {needed}; it is {soft} \
         (raise it with ulimit -Hn or LimitNOFILE)"
    );
}

/// `CROWD` connections to `addr` that send nothing, `PER_SOURCE` from each source address.
async fn crowd(addr: &str) -> Vec<tokio::net::TcpStream> {
    let addr: SocketAddr = addr.parse().unwrap();
    let mut held = Vec::with_capacity(CROWD);
    for i in 0..CROWD {
        let last = u8::try_from(2 + i / PER_SOURCE).unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, last), 0)))
            .unwrap();
        held.push(socket.connect(addr).await.unwrap());
    }
    held
}

/// How many sockets process `pid` has open.
fn sockets_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// How many connections from the crowd (127.0.0.2 and up) process `pid` holds: its sockets
/// whose peer, in the kernel's table of TCP sockets, is a crowd address. Exact, whatever other
/// sockets the process opens or closes meanwhile (a readiness probe's, say).
fn crowd_held_by(pid: u32) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|target| {
            let t = target.to_string_lossy().into_owned();
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let sources = CROWD.div_ceil(PER_SOURCE);
    // Addresses as the table writes them: the IPv4 address's bytes in host (little-endian) order.
    let crowd: Vec<String> = (0..sources)
        .map(|i| format!("{:02X}00007F:", 2 + i))
        .collect();
    // The table is read in pieces while other tests open and close sockets, so an entry may
    // show twice (counted once, by its inode) or be missed (the callers poll).
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let crowd_peer = fields.len() > 9 && crowd.iter().any(|c| fields[2].starts_with(c));
            (crowd_peer && inodes.contains(fields[9])).then(|| fields[9].to_owned())
        })
        .collect::<std::collections::HashSet<String>>()
        .len()
}

/// Waits, at most 20 s, until process `pid` holds the whole crowd: accepted and kept, not
/// waiting in the backlog nor closed for being over a cap.
fn wait_for_crowd(pid: u32) {
    let what = format!("the server holds the {CROWD} connections of the crowd");
    wait_until(&what, || crowd_held_by(pid) >= CROWD);
}

/// Sends `GET path` with `Connection: close` on each held connection, and checks that every one
/// is answered 200 with `body`.
async fn every_one_answered(held: Vec<tokio::net::TcpStream>, path: &'static str, body: &str) {
    let tasks: Vec<_> = held
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let request =
                    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                s.write_all(request.as_bytes()).await.unwrap();
                let mut answer = String::new();
                s.read_to_string(&mut answer).await.unwrap();
                answer
            })
        })
        .collect();
    for t in tasks {
        let answer = tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("answered within 20 s")
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with(body), "{answer}");
    }
}

/// Statuses of 20 requests for one counter (5 an hour), each on a new connection from
/// 127.0.0.1, in order.
async fn twenty_requests(request: impl Fn() -> reqwest::RequestBuilder) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(request().send().await.unwrap().status().as_u16());
    }
    statuses
}

fn five_admitted_then_refused() -> Vec<u16> {
    let mut expected = vec![200; 5];
    expected.resize(20, 429);
    expected
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_while_5000_idle_connections_are_held() {
    room_for_the_crowd();
    let (_dir, rules) = rules();
    // The server must not close the idle connections itself while the test runs.
    let (serve, http, _grpc) = serve(&rules, &["--header-timeout", "1h"]);
    let held = crowd(&http).await;
    wait_for_crowd(serve.pid());
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"crowd"}]}]}"#;
    let statuses = twenty_requests(|| {
        client
            .post(format!("http://{http}/v1/check"))
            .header("content-type", "application/json")
            .body(body)
    })
    .await;
    assert_eq!(statuses, five_admitted_then_refused());
    // Every idle connection is still there, and served.
    wait_for_crowd(serve.pid());
    every_one_answered(held, "/healthz", "ok").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_answers_while_5000_idle_connections_are_held() {
    room_for_the_crowd();
    let (_dir, rules) = rules();
    let upstream = sluice_testing::upstream().await;
    let upstream_url = format!("http://{}", upstream.addr);
    let (proxy, listen, _admin) = proxy(&rules, &upstream_url, &["--header-timeout", "1h"]);
    let held = crowd(&listen).await;
    wait_for_crowd(proxy.pid());
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let statuses = twenty_requests(|| client.get(format!("http://{listen}/api/crowd"))).await;
    assert_eq!(statuses, five_admitted_then_refused());
    assert_eq!(
        upstream.hits(),
        5,
        "the refused ones never reached the upstream"
    );
    wait_for_crowd(proxy.pid());
    // An unrouted path passes to the upstream, from every idle connection.
    every_one_answered(held, "/open", "upstream GET /open").await;
    assert_eq!(upstream.hits(), 5 + CROWD);
}

/// The open-files limit the descriptor test puts on a running server.
const FEW_FILES: u64 = 256;

/// `GET /healthz` on a kept-alive connection: the status line, once the whole answer is read.
fn healthz_kept_alive(s: &TcpStream) -> String {
    let mut w = s;
    w.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    let mut length = 0;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).unwrap();
    status.trim_end().to_owned()
}

/// How many connections wait in the accept queue of the listener on `addr` (127.0.0.1), as
/// `/proc/net/tcp` shows it: for a listening socket, the receive queue is that backlog.
fn accept_backlog(addr: &str) -> u64 {
    let port: u16 = addr.rsplit_once(':').unwrap().1.parse().unwrap();
    let local = format!("0100007F:{port:04X}");
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 4 && f[1] == local && f[3] == "0A")
        .and_then(|f| u64::from_str_radix(f[4].split_once(':')?.1, 16).ok())
        .expect("the listener in /proc/net/tcp")
}

/// The `repeated` count of every "out of file descriptors" line in a JSON log.
fn out_of_descriptors_lines(log: &std::path::Path) -> Vec<u64> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("out of file descriptors"))
        })
        .map(|v| v["fields"]["repeated"].as_u64().expect("a repeated count"))
        .collect()
}

/// A server out of file descriptors for real: the connections it holds are still served, new
/// ones wait in the backlog, accepting resumes as soon as connections close, and the failing
/// accepts are logged once per 10 s with their count, not once each.
///
/// The limit is lowered under the running server (`prlimit`): at start, `serve` fits its
/// connection cap to the limit it finds ((limit - 256) / 3 per listener: one connection at a
/// limit of 256), so connections alone never exhaust a limit it started under. A limit lowered
/// afterwards, or descriptors taken by something else, is what makes `accept` fail.
#[test]
fn out_of_file_descriptors_pauses_accepting_until_connections_close() {
    let (dir, rules) = rules();
    let log = dir.path().join("serve.log");
    let serve = ServeProcess::builder(env!("CARGO_BIN_EXE_sluice"))
        .config(&rules)
        .args(["--header-timeout", "1h", "--log-format", "json"])
        .log_to(&log)
        .start();
    let (http, pid) = (serve.http().to_owned(), serve.pid());
    let lowered = Instant::now();
    rlimit::prlimit(
        i32::try_from(pid).unwrap(),
        rlimit::Resource::NOFILE,
        Some((FEW_FILES, FEW_FILES)),
        None,
    )
    .expect("lower the server's open-files limit");
    let own = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    assert!(
        own + 50 < FEW_FILES as usize,
        "{own} descriptors open already"
    );

    // More idle connections than the limit: the server takes what fits, the rest wait in the
    // listener's backlog (1,024).
    let mut held: Vec<TcpStream> = (0..FEW_FILES + 100)
        .map(|_| TcpStream::connect(&http).unwrap())
        .collect();
    wait_until(
        "accept fails, is logged, and connections wait in the backlog",
        || !out_of_descriptors_lines(&log).is_empty() && accept_backlog(&http) > 0,
    );
    let accepted = sockets_of(pid);
    // The connections it holds are served meanwhile (the first were accepted first).
    for s in &held[..20] {
        assert_eq!(healthz_kept_alive(s), "HTTP/1.1 200 OK");
    }
    // Accepting goes on failing, and is logged again only after a while, with its count.
    wait_within(
        "a second log line counts the failed accepts since the first",
        Duration::from_secs(30),
        || out_of_descriptors_lines(&log).len() >= 2,
    );
    // One more client asks now; it is answered once connections close.
    let mut late = TcpStream::connect(&http).unwrap();
    late.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let backlog = accept_backlog(&http);
    held.drain(..200);
    late.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut answer = String::new();
    late.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let elapsed = lowered.elapsed();

    let lines = out_of_descriptors_lines(&log);
    let failed_accepts: u64 = lines.iter().sum();
    eprintln!(
        "limit {FEW_FILES}: {own} descriptors of its own, {accepted} sockets held, {backlog} \
         connections waiting; {failed_accepts} failed accepts in {elapsed:?}, logged in {} \
         lines",
        lines.len()
    );
    // One line per 10 s at most: not one per failed accept.
    assert!(
        lines.len() as u64 <= elapsed.as_secs() / 10 + 1,
        "{} lines in {elapsed:?}",
        lines.len()
    );
    assert!(
        lines[1] > 1,
        "the second line counts the accepts since the first: {lines:?}"
    );
    // Accepting waits 100 ms after each failure instead of spinning.
    let most = u64::try_from(elapsed.as_millis() / 100).unwrap() + 1;
    assert!(
        failed_accepts <= most,
        "{failed_accepts} failed accepts in {elapsed:?}"
    );
}
