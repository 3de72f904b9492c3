//! The admin endpoints seen from another host: the test makes one, a network namespace joined
//! to this one by a veth pair, and runs `curl` inside it against a real `sluice serve` that
//! listens on the veth address. Without `--admin-token` every admin endpoint refuses that peer
//! (403); with it, they refuse a missing or wrong token (401) and obey the right one. The
//! decision endpoints answer it either way.
//!
//! Creating a namespace needs root (CAP_NET_ADMIN). Without it the test says why on stderr and
//! passes without running; `./scripts/test` installs `ip` and `curl` when they are missing.

use std::io::Write as _;
use std::process::{Command, Output};

use serde_json::Value;
use sluice_test_support::free_port;
use sluice_test_support::{ServeProcess, rules_file};

/// Two decisions an hour per value of `k`, in a window that starts at the key's first request:
/// a window aligned to the clock could end between the exhausting checks and the check after a
/// refused reset, and the test would read a new window as a reset.
const RULES: &str = "domain: d
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 2, alignment: first_request}
";

const TOKEN: &str = "s3cret-admin-token";

fn ip(args: &[&str]) -> Output {
    Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip {args:?}: {e}; install iproute2 (./scripts/test does)"))
}

fn ip_ok(args: &[&str]) {
    let out = ip(args);
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace joined to this one by a veth pair, deleted (with the pair) when dropped,
/// panic or not.
struct Namespace {
    name: String,
    /// This side's address on the pair, where the server listens.
    host_addr: String,
    veth: String,
}

impl Namespace {
    /// Creates the namespace and the pair on a /30 of 198.18.0.0/15 (reserved for network
    /// tests, RFC 2544), both named after this process so that parallel runs stay apart.
    /// `Err` says why namespaces cannot be made here.
    fn create() -> Result<Namespace, String> {
        let pid = std::process::id();
        let name = format!("sluice-test-{pid}");
        let out = ip(&["netns", "add", &name]);
        if !out.status.success() {
            return Err(format!(
                "cannot create a network namespace (root with CAP_NET_ADMIN is needed): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let (veth, peer) = (format!("slh{pid}"), format!("sln{pid}"));
        // From here on, dropping the guard cleans up whatever was made.
        let block = (pid % 32_768) * 4;
        let base = format!("198.{}.{}", 18 + block / 65_536, (block / 256) % 256);
        let last = block % 256;
        let namespace = Namespace {
            name,
            host_addr: format!("{base}.{}", last + 1),
            veth,
        };
        let ns = namespace.name.as_str();
        ip_ok(&[
            "link",
            "add",
            &namespace.veth,
            "type",
            "veth",
            "peer",
            "name",
            &peer,
            "netns",
            ns,
        ]);
        let host_cidr = format!("{}/30", namespace.host_addr);
        ip_ok(&["addr", "add", &host_cidr, "dev", &namespace.veth]);
        ip_ok(&["link", "set", &namespace.veth, "up"]);
        let peer_cidr = format!("{base}.{}/30", last + 2);
        ip_ok(&["-n", ns, "addr", "add", &peer_cidr, "dev", &peer]);
        ip_ok(&["-n", ns, "link", "set", &peer, "up"]);
        ip_ok(&["-n", ns, "link", "set", "lo", "up"]);
        Ok(namespace)
    }

    /// `curl` run inside the namespace: the status and the body of `method url`, with
    /// `Authorization: Bearer token` when given and a JSON `body` when given.
    fn curl(
        &self,
        method: &str,
        url: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (u16, String) {
        let mut command = Command::new("ip");
        command.args([
            "netns",
            "exec",
            &self.name,
            "curl",
            "-sS",
            "--max-time",
            "20",
        ]);
        command.args(["-X", method, "-w", "\n%{http_code}"]);
        if let Some(token) = token {
            command.args(["-H", &format!("Authorization: Bearer {token}")]);
        }
        if let Some(body) = body {
            command.args([
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                body,
            ]);
        }
        let out = command
            .arg(url)
            .output()
            .unwrap_or_else(|e| panic!("ip netns exec … curl: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "curl {method} {url}: {}{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (body, status) = stdout.rsplit_once('\n').expect("a status line");
        (
            status.trim().parse().expect("a status code"),
            body.to_owned(),
        )
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        // Deleting the namespace destroys its end of the pair, and with it this one; the link is
        // deleted too in case the namespace went first.
        let _ = ip(&["netns", "del", &self.name]);
        let _ = ip(&["link", "del", &self.veth]);
    }
}

/// `sluice serve` listening on `addr` (its gRPC listener on loopback), with `extra` flags.
fn serve(rules: &str, addr: &str, extra: &[&str]) -> ServeProcess {
    ServeProcess::builder(env!("CARGO_BIN_EXE_sluice"))
        .config(rules)
        .http_addr(addr)
        .args(extra)
        .start()
}

/// A counter key as a URL path segment.
fn path_segment(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// What the peer in the namespace sees of one server.
struct Peer<'a> {
    ns: &'a Namespace,
    base: String,
}

impl Peer<'_> {
    fn call(&self, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
        self.ns
            .curl(method, &format!("{}{path}", self.base), token, None)
    }

    /// `POST /v1/check` for `k=value`: whether it was admitted, and the counter's key.
    fn check(&self, value: &str) -> (bool, String) {
        let body = format!(
            r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"k","value":"{value}"}}]}}]}}"#
        );
        let url = format!("{}/v1/check", self.base);
        let (status, text) = self.ns.curl("POST", &url, None, Some(&body));
        assert!(status == 200 || status == 429, "{status} {text}");
        let answer: Value = serde_json::from_str(&text).unwrap();
        let key = answer["descriptors"][0]["limits"][0]["key"]
            .as_str()
            .unwrap()
            .to_owned();
        (status == 200, key)
    }

    /// Uses up `k=value`'s two an hour and returns the counter's key path.
    fn exhaust(&self, value: &str) -> String {
        assert!(self.check(value).0);
        assert!(self.check(value).0);
        let (admitted, key) = self.check(value);
        assert!(!admitted, "the third in an hour is refused");
        format!("/v1/keys/{}", path_segment(&key))
    }

    /// Envoy's `/json`, which is no admin endpoint: answered whoever asks.
    fn envoy_json(&self) -> String {
        let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"json"}]}]}"#;
        let url = format!("{}/json", self.base);
        let (status, text) = self.ns.curl("POST", &url, None, Some(body));
        assert_eq!(status, 200, "{text}");
        text
    }
}

#[test]
fn admin_endpoints_refuse_a_remote_peer_without_the_token_and_obey_it_with() {
    let ns = match Namespace::create() {
        Ok(ns) => ns,
        Err(why) => {
            // Straight to the process's stderr, past the test harness's capture, so that the
            // skip is seen in a plain `cargo test` run.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED admin_endpoints_refuse_a_remote_peer…: {why}"
            );
            return;
        }
    };
    let (rules, _dir) = rules_file("rules.yaml", RULES);
    let rules = rules.to_str().unwrap();
    let admin_paths = [
        ("GET", "/v1/rules"),
        ("POST", "/v1/reload"),
        ("GET", "/v1/dashboard"),
        ("GET", "/v1/overrides/d"),
        ("PUT", "/v1/overrides/d"),
        ("DELETE", "/v1/overrides/d"),
    ];

    // Without a token: loopback only.
    let addr = format!("{}:{}", ns.host_addr, free_port());
    let _closed = serve(rules, &addr, &[]);
    let peer = Peer {
        ns: &ns,
        base: format!("http://{addr}"),
    };
    let key = peer.exhaust("closed");
    for (method, path) in admin_paths
        .iter()
        .chain(&[("GET", &*key), ("DELETE", &*key)])
    {
        for token in [None, Some(TOKEN)] {
            let (status, text) = peer.call(method, path, token);
            assert_eq!(status, 403, "{method} {path} with {token:?}: {text}");
            assert!(text.contains("--admin-token"), "{text}");
        }
    }
    assert!(!peer.check("closed").0, "the refused DELETE reset nothing");
    assert!(peer.envoy_json().contains("\"OK\""));

    // With a token: the peer must present it.
    let addr = format!("{}:{}", ns.host_addr, free_port());
    let _open = serve(rules, &addr, &["--admin-token", TOKEN]);
    let peer = Peer {
        ns: &ns,
        base: format!("http://{addr}"),
    };
    let key = peer.exhaust("open");
    for (method, path) in admin_paths
        .iter()
        .chain(&[("GET", &*key), ("DELETE", &*key)])
    {
        for token in [None, Some("not-the-token")] {
            let (status, text) = peer.call(method, path, token);
            assert_eq!(status, 401, "{method} {path} with {token:?}: {text}");
        }
    }
    assert!(!peer.check("open").0, "the refused DELETE reset nothing");
    let (status, rules) = peer.call("GET", "/v1/rules", Some(TOKEN));
    assert_eq!(status, 200, "{rules}");
    assert!(rules.contains(r#""domain":"d""#), "{rules}");
    let (status, reload) = peer.call("POST", "/v1/reload", Some(TOKEN));
    assert_eq!(status, 200, "{reload}");
    assert!(reload.contains("unchanged"), "{reload}");
    let (status, dashboard) = peer.call("GET", "/v1/dashboard", Some(TOKEN));
    assert_eq!(status, 200, "{dashboard}");
    let (status, counter) = peer.call("GET", &key, Some(TOKEN));
    assert_eq!(status, 200, "{counter}");
    assert!(counter.contains(r#""limited":true"#), "{counter}");
    let (status, reset) = peer.call("DELETE", &key, Some(TOKEN));
    assert_eq!(status, 200, "{reset}");
    assert!(reset.contains(r#""reset":true"#), "{reset}");
    assert!(peer.check("open").0, "the counter was reset");
    assert!(peer.envoy_json().contains("\"OK\""));
}
