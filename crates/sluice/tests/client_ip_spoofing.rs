//! `sluice proxy` as a real process: no mix of forwarding headers lets a client escape a per-IP
//! limit, with trusted proxies and without. The requests come from loopback, as they would from
//! a proxy on the same host: each carries what a client sent plus what an appending proxy
//! (nginx, which writes `X-Forwarded-For` only) adds.

use sluice_test_support::{Spawned, free_addr, rules_file, spawn_listening};

/// 5 an hour per client IP on /api/*, in a window that starts at each address's first request:
/// a window aligned to the clock could end between two of a batch's requests, and let through
/// more than 5 for reasons that have nothing to do with forwarding headers.
fn rules(trusted: bool) -> String {
    format!(
        "domain: gw
descriptors:
  - key: client_ip
    rate_limit: {{unit: hour, requests_per_unit: 5, alignment: first_request}}
{}routes:
  - path: /api/*
    descriptors: [[{{key: client_ip, from: client_ip}}]]
",
        if trusted {
            "trusted_proxies: [127.0.0.1/32]\n"
        } else {
            ""
        }
    )
}

struct Setup {
    _dir: tempfile::TempDir,
    _upstream: Spawned,
    _proxy: Spawned,
    url: String,
}

fn start(trusted: bool, extra: &[&str]) -> Setup {
    let (path, dir) = rules_file("gw.yaml", &rules(trusted));
    let (upstream, listen) = (free_addr(), free_addr());
    let bin = env!("CARGO_BIN_EXE_sluice");
    let up = spawn_listening(
        bin,
        &["bench", "upstream", "--listen", &upstream],
        &upstream,
    );
    let upstream_url = format!("http://{upstream}");
    let mut args = vec![
        "proxy",
        "--config",
        path.to_str().unwrap(),
        "--listen",
        &listen,
        "--upstream",
        &upstream_url,
    ];
    args.extend_from_slice(extra);
    let proxy = spawn_listening(bin, &args, &listen);
    Setup {
        _dir: dir,
        _upstream: up,
        _proxy: proxy,
        url: format!("http://{listen}/api/items"),
    }
}

/// Sends 60 requests with the headers `make(i)` gives, and counts the admitted ones.
async fn admitted(url: &str, make: impl Fn(usize) -> Vec<(&'static str, String)>) -> usize {
    let client = reqwest::Client::new();
    let mut ok = 0;
    for i in 0..60 {
        let mut request = client.get(url);
        for (name, value) in make(i) {
            request = request.header(name, value);
        }
        let status = request.send().await.unwrap().status().as_u16();
        assert!(status == 200 || status == 429, "unexpected {status}");
        ok += usize::from(status == 200);
    }
    ok
}

/// An address of the client's choosing, different every time.
fn random(i: usize) -> String {
    format!("203.0.{}.{}", i / 250, i % 250 + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_the_client_cannot_choose_its_address() {
    let s = start(true, &[]);
    // The client sends its own Forwarded; the proxy appends the real address to X-Forwarded-For.
    let n = admitted(&s.url, |i| {
        vec![
            ("forwarded", format!("for={}", random(i))),
            ("x-forwarded-for", "198.51.100.7".to_owned()),
        ]
    })
    .await;
    assert_eq!(n, 5, "a client-written Forwarded decided the address");
    // The client starts X-Forwarded-For with a lie; the proxy appends the truth.
    let n = admitted(&s.url, |i| {
        vec![("x-forwarded-for", format!("{}, 198.51.100.8", random(i)))]
    })
    .await;
    assert_eq!(
        n, 5,
        "a client-written X-Forwarded-For hop decided the address"
    );
    // Both at once, with the trusted proxy's own address among the lies.
    let n = admitted(&s.url, |i| {
        vec![
            ("forwarded", format!("for=\"{}\", for=127.0.0.1", random(i))),
            (
                "x-forwarded-for",
                format!("127.0.0.1, {}, 198.51.100.9", random(i)),
            ),
        ]
    })
    .await;
    assert_eq!(n, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_forwarded_chosen_only_forwarded_is_read() {
    let s = start(true, &["--client-ip-header", "forwarded"]);
    // A proxy that writes Forwarded; the client's X-Forwarded-For changes nothing.
    let n = admitted(&s.url, |i| {
        vec![
            ("x-forwarded-for", random(i)),
            ("forwarded", format!("for={}, for=198.51.100.10", random(i))),
        ]
    })
    .await;
    assert_eq!(n, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_trusted_proxies_no_header_is_read() {
    let s = start(false, &[]);
    let n = admitted(&s.url, |i| {
        vec![
            ("forwarded", format!("for={}", random(i))),
            ("x-forwarded-for", random(i)),
        ]
    })
    .await;
    // Every request is the loopback peer's.
    assert_eq!(n, 5);
}
