//! Real `redis-server` processes for tests: one server, or a 3-master Cluster, on free loopback
//! ports, each in its own temporary directory, without persistence.
//!
//! Every server is killed by PID when its handle drops. Servers kept in statics never drop, so
//! each server also gets a watchdog: a `sh` that waits for this test process to close its stdin
//! (which happens however the process ends) and then kills the server and removes its directory.

#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_core::testing::Backend;
use sluice_core::{
    Alignment, FixedWindow, Gcra, LeakyQueue, Policy, Rate, SlidingCounter, SlidingLog, TokenBucket,
};
use sluice_redis::{RedisOptions, RedisStore};

/// How long a server may take to come up before the test gives up.
const STARTUP: Duration = Duration::from_secs(20);

/// A `redis-server` child process.
pub struct RedisServer {
    pub port: u16,
    /// The Cluster bus port, for Cluster nodes.
    bus_port: Option<u16>,
    /// For a Sentinel: the port of the master it watches (as `mymaster`).
    sentinel_of: Option<u16>,
    /// For a replica: the port of its master.
    replica_of: Option<u16>,
    /// For a server that also speaks TLS: its TLS port (certificates in `dir`).
    pub tls_port: Option<u16>,
    dir: tempfile::TempDir,
    child: Option<Child>,
    watchdog: Option<(Child, ChildStdin)>,
}

/// A port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl RedisServer {
    /// A standalone server.
    pub fn start() -> Self {
        Self::start_node(false)
    }

    fn start_node(cluster: bool) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut server = RedisServer {
            port: free_port(),
            bus_port: cluster.then(free_port),
            sentinel_of: None,
            tls_port: None,
            dir,
            replica_of: None,
            child: None,
            watchdog: None,
        };
        server.spawn();
        server
    }

    /// A server that speaks TLS on [`RedisServer::tls_port`] (and plain RESP on its port), with a
    /// certificate for `127.0.0.1` signed by a throwaway CA at `dir/ca.crt`.
    pub fn start_tls() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let openssl = |args: &[&str]| {
            let ok = Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "openssl {args:?} failed");
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=sluice-test-ca",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ]);
        std::fs::write(dir.path().join("san.ext"), "subjectAltName=IP:127.0.0.1\n")
            .expect("write san.ext");
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);
        let mut server = RedisServer {
            port: free_port(),
            bus_port: None,
            sentinel_of: None,
            tls_port: Some(free_port()),
            replica_of: None,
            dir,
            child: None,
            watchdog: None,
        };
        server.spawn();
        server
    }

    /// A replica of `master`.
    pub fn start_replica(master: &RedisServer) -> Self {
        let mut server = RedisServer {
            port: free_port(),
            bus_port: None,
            sentinel_of: None,
            tls_port: None,
            replica_of: Some(master.port),
            dir: tempfile::tempdir().expect("a temporary directory"),
            child: None,
            watchdog: None,
        };
        server.spawn();
        wait_until("the replica is in sync", || {
            server
                .command(&["INFO", "replication"])
                .is_some_and(|i| i.contains("master_link_status:up"))
        });
        server
    }

    /// A Sentinel watching `master` under the name `mymaster`.
    pub fn start_sentinel(master: &RedisServer) -> Self {
        let mut server = RedisServer {
            port: free_port(),
            bus_port: None,
            sentinel_of: Some(master.port),
            tls_port: None,
            replica_of: None,
            dir: tempfile::tempdir().expect("a temporary directory"),
            child: None,
            watchdog: None,
        };
        server.spawn();
        wait_until("the sentinel knows the master", || {
            server
                .command(&["SENTINEL", "get-master-addr-by-name", "mymaster"])
                .is_some_and(|r| r.contains(&master.port.to_string()))
        });
        server
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        if let Some(master) = self.sentinel_of {
            // Sentinel rewrites its configuration file, so it lives in the server's directory.
            let conf = self.dir.path().join("sentinel.conf");
            let text = format!(
                "port {}\nbind 127.0.0.1\nprotected-mode no\ndir {}\n\
                 sentinel monitor mymaster 127.0.0.1 {master} 1\n\
                 sentinel down-after-milliseconds mymaster 5000\n",
                self.port,
                self.dir.path().display()
            );
            std::fs::write(&conf, text).expect("write sentinel.conf");
            cmd.arg(&conf).arg("--sentinel");
        } else {
            cmd.arg("--port")
                .arg(self.port.to_string())
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--protected-mode", "no", "--loglevel", "warning"])
                .arg("--dir")
                .arg(self.dir.path());
        }
        if let Some(master) = self.replica_of {
            cmd.args(["--replicaof", "127.0.0.1"])
                .arg(master.to_string());
        }
        if let Some(tls) = self.tls_port {
            let file = |name: &str| self.dir.path().join(name);
            cmd.arg("--tls-port")
                .arg(tls.to_string())
                .arg("--tls-cert-file")
                .arg(file("server.crt"))
                .arg("--tls-key-file")
                .arg(file("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(file("ca.crt"))
                .args(["--tls-auth-clients", "no"]);
        }
        if let Some(bus) = self.bus_port {
            cmd.args(["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"])
                .arg("--cluster-config-file")
                .arg(self.dir.path().join("nodes.conf"))
                .arg("--cluster-port")
                .arg(bus.to_string());
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs; install it with ./scripts/test or apt-get");
        let mut watchdog = Command::new("sh")
            .arg("-c")
            .arg(r#"read _; kill -9 "$0" 2>/dev/null; rm -rf "$1""#)
            .arg(child.id().to_string())
            .arg(self.dir.path())
            .stdin(Stdio::piped())
            .spawn()
            .expect("sh runs");
        let stdin = watchdog.stdin.take().expect("a piped stdin");
        self.child = Some(child);
        self.watchdog = Some((watchdog, stdin));
        wait_until("redis-server answers PING", || {
            self.command(&["PING"]).is_some_and(|r| r.contains("PONG"))
        });
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL, no goodbye), keeping its port for [`RedisServer::restart`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some((mut watchdog, _stdin)) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Runs one command with `redis-cli` and returns its output, or `None` if it failed.
    pub fn command(&self, args: &[&str]) -> Option<String> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
            .filter(|s| !s.contains("Could not connect"))
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `ready` until it holds, for at most [`STARTUP`]. Waiting for a server to come up is the
/// only waiting the tests do; no assertion depends on how long anything took.
pub fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + STARTUP;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// [`wait_until`] for async conditions, on the test's runtime.
pub async fn eventually<F, Fut>(what: &str, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + STARTUP;
    while !ready().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A 3-master Redis Cluster.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_node(true)).collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for node in &nodes {
            wait_until("every node sees the cluster as ok", || {
                node.command(&["CLUSTER", "INFO"]).is_some_and(|i| {
                    i.contains("cluster_state:ok") && i.contains("cluster_known_nodes:3")
                })
            });
        }
        RedisCluster { nodes }
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }
}

/// One standalone server for every test of this process that needs no server of its own.
pub fn shared_server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

/// One Cluster for every test of this process.
pub fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

/// A key prefix no other test of this run uses, so tests can share servers.
pub fn unique_prefix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "test{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Options for tests: a unique prefix and a generous timeout, since debug builds on a loaded
/// machine are slow and these tests are about behaviour, not speed.
pub fn test_options() -> RedisOptions {
    RedisOptions::default()
        .prefix(unique_prefix())
        .timeout(Duration::from_secs(5))
}

/// Redis `TIME` on the server at `port`, in nanoseconds since the epoch.
pub fn redis_time_nanos(port: u16) -> i64 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    s.write_all(b"*1\r\n$4\r\nTIME\r\n").expect("write");
    let mut buf = [0u8; 256];
    let mut got = Vec::new();
    while got.iter().filter(|&&b| b == b'\n').count() < 5 {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "TIME reply cut short");
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    let nums: Vec<i64> = text
        .lines()
        .filter(|l| !l.starts_with('*') && !l.starts_with('$'))
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    nums[0] * 1_000_000_000 + nums[1] * 1_000
}

/// The offset that puts a store's time 20 ms after a whole second of Redis time, so that a test
/// of one-second windows does not start just before a boundary. The suite runs on real Redis
/// time, which keeps moving (a few milliseconds per test); without this, a clock-aligned window
/// rolling over mid-test would make an exact count flaky.
pub fn offset_to_second_start(port: u16) -> i64 {
    offset_to_window_start(port, Duration::from_secs(1))
}

/// The offset that puts a store's time 20 ms after the start of a clock-aligned `window`.
pub fn offset_to_window_start(port: u16, window: Duration) -> i64 {
    let w = i64::try_from(window.as_nanos()).expect("a window below 292 years");
    let phase = redis_time_nanos(port).rem_euclid(w);
    w - phase + 20_000_000
}

/// One policy per algorithm with a limit of 50 that does not refill in the seconds a test runs,
/// so that a count of admissions is exact however slow the machine.
pub fn fifty_per_hour() -> Vec<Policy> {
    let hour = Duration::from_secs(3600);
    let slow = Rate::per_minute(1);
    vec![
        TokenBucket::new(50, slow).map(Policy::from),
        Gcra::new(slow, 50).map(Policy::from),
        LeakyQueue::new(slow, 49, hour).map(Policy::from),
        FixedWindow::new(50, hour, Alignment::FirstRequest).map(Policy::from),
        FixedWindow::new(50, hour, Alignment::Clock { utc_offset_secs: 0 }).map(Policy::from),
        SlidingLog::new(50, hour).map(Policy::from),
        SlidingCounter::new(50, hour).map(Policy::from),
    ]
    .into_iter()
    .map(|p| p.expect("valid policy"))
    .collect()
}

/// A name for a policy in assertion messages.
pub fn name(p: &Policy) -> String {
    match p {
        Policy::FixedWindow(fw) => format!("fixed_window {:?}", fw.alignment()),
        p => p.algorithm().to_string(),
    }
}

/// A Redis store under the shared backend suite.
pub struct RedisBackend {
    pub store: RedisStore,
}

impl Backend for RedisBackend {
    type Store = RedisStore;

    fn store(&self) -> &RedisStore {
        &self.store
    }

    fn advance(&self, d: Duration) {
        self.store.advance_time(d);
    }
}

/// A fresh store on the shared standalone server, aligned to a second.
pub async fn standalone_backend() -> RedisBackend {
    let server = shared_server();
    let store = RedisStore::connect(&server.url(), test_options())
        .await
        .expect("connect");
    store.set_time_offset(offset_to_second_start(server.port));
    RedisBackend { store }
}

/// A fresh store on the shared Cluster, aligned to a second.
pub async fn cluster_backend() -> RedisBackend {
    let cluster = shared_cluster();
    let store = RedisStore::connect(&cluster.url(), test_options())
        .await
        .expect("connect");
    store.set_time_offset(offset_to_second_start(cluster.nodes[0].port));
    RedisBackend { store }
}
