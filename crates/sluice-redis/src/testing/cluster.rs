//! [`RedisCluster`]: a 3-master Redis Cluster of [`RedisServer`]s, made with `redis-cli --cluster
//! create`.

use std::process::{Command, Stdio};

use super::server::RedisServer;
use super::wait::wait_until;

/// A 3-master Redis Cluster.
pub struct RedisCluster {
    /// The three masters, each holding a third of the slots.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three nodes and joins them into a Cluster, waiting until every node sees it ok.
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
