//! [`RedisServer`]: one `redis-server` process (standalone, TLS, replica or Sentinel) on free
//! loopback ports, in its own temporary directory, without persistence.
//!
//! A server is killed by PID when its handle drops. A server kept in a static never drops, so
//! each server also gets a watchdog: a `sh` that waits for this process to close its stdin
//! (which happens however the process ends), then kills the server and removes its directory.

use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::time::Duration;

use sluice_test_support::{Spawned, free_port, wait_until};

/// A `redis-server` child process.
pub struct RedisServer {
    /// The port it speaks plain RESP on, on 127.0.0.1.
    pub port: u16,
    /// For a Cluster node: its bus port and node timeout.
    cluster: Option<ClusterNode>,
    /// For a Sentinel: the port of the master it watches (as `mymaster`).
    sentinel_of: Option<u16>,
    /// For a replica: the port of its master.
    replica_of: Option<u16>,
    /// For a server that also speaks TLS: its TLS port (certificates in `dir`).
    pub tls_port: Option<u16>,
    dir: tempfile::TempDir,
    child: Option<Spawned>,
    watchdog: Option<(Spawned, ChildStdin)>,
}

/// What a Cluster node needs beyond a standalone server.
#[derive(Debug, Clone, Copy)]
struct ClusterNode {
    /// The port the nodes talk to each other on.
    bus_port: u16,
    /// How long a peer may stay silent before this node flags it as failing: a replica takes
    /// over from a dead master about twice this after it dies.
    node_timeout: Duration,
}

impl RedisServer {
    /// A standalone server.
    pub fn start() -> Self {
        Self::start_node(None)
    }

    /// A Cluster node not yet in a Cluster, flagging a peer silent for `node_timeout` as failing.
    pub(super) fn start_cluster_node(node_timeout: Duration) -> Self {
        Self::start_node(Some(ClusterNode {
            bus_port: free_port(),
            node_timeout,
        }))
    }

    /// A standalone server, or with `cluster` a Cluster node not yet in a Cluster.
    fn start_node(cluster: Option<ClusterNode>) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut server = RedisServer {
            port: free_port(),
            cluster,
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
            cluster: None,
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
            cluster: None,
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
            cluster: None,
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
        if let Some(node) = self.cluster {
            cmd.args(["--cluster-enabled", "yes", "--cluster-node-timeout"])
                .arg(node.node_timeout.as_millis().to_string())
                .arg("--cluster-config-file")
                .arg(self.dir.path().join("nodes.conf"))
                .arg("--cluster-port")
                .arg(node.bus_port.to_string());
        }
        let child = Spawned(
            cmd.stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server runs; install it with ./scripts/test or apt-get"),
        );
        let mut watchdog = Spawned::spawn(
            Command::new("sh")
                .arg("-c")
                .arg(r#"read _; kill -9 "$0" 2>/dev/null; rm -rf "$1""#)
                .arg(child.pid().to_string())
                .arg(self.dir.path())
                .stdin(Stdio::piped()),
        );
        let stdin = watchdog.0.stdin.take().expect("a piped stdin");
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
        // Each is killed by PID and reaped as it drops.
        self.child = None;
        self.watchdog = None;
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

    /// Its temporary directory: its configuration, and for a TLS server its certificates
    /// (`ca.crt` signs the server's).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
