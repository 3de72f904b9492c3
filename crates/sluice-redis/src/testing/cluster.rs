//! [`RedisCluster`]: a Redis Cluster of [`RedisServer`]s, 3 masters with or without a replica
//! each, made with `redis-cli --cluster create`.

use std::ops::RangeInclusive;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::server::RedisServer;
use sluice_test_support::wait_until;

/// A 3-master Redis Cluster, with or without one replica per master.
pub struct RedisCluster {
    /// Every node. Without replicas, the three masters, each holding a third of the slots. With
    /// them, which node is a master is Redis's choice, and a failover changes it: ask
    /// [`RedisCluster::is_master`] and [`RedisCluster::replica_of`].
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three nodes and joins them into a Cluster, waiting until every node sees it ok.
    pub fn start() -> Self {
        Self::create(0, Duration::from_secs(5))
    }

    /// Three masters with one replica each, whose nodes flag a peer silent for `node_timeout` as
    /// failing: a master killed is replaced by its replica about twice that later. Waits until
    /// every node sees the Cluster ok and every replica is in sync.
    pub fn start_with_replicas(node_timeout: Duration) -> Self {
        Self::create(1, node_timeout)
    }

    fn create(replicas: usize, node_timeout: Duration) -> Self {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| RedisServer::start_cluster_node(node_timeout))
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .arg("--cluster-replicas")
            .arg(replicas.to_string())
            .arg("--cluster-yes")
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
        let known = format!("cluster_known_nodes:{}", nodes.len());
        for node in &nodes {
            wait_until("every node sees the cluster as ok", || {
                node.command(&["CLUSTER", "INFO"])
                    .is_some_and(|i| i.contains("cluster_state:ok") && i.contains(&known))
            });
        }
        let cluster = RedisCluster { nodes };
        for i in 0..cluster.nodes.len() {
            if !cluster.is_master(i) {
                wait_until("every replica is in sync with its master", || {
                    cluster.nodes[i]
                        .command(&["INFO", "replication"])
                        .is_some_and(|r| r.contains("master_link_status:up"))
                });
            }
        }
        cluster
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

    /// Whether node `i` answers `ROLE` as a master now.
    pub fn is_master(&self, i: usize) -> bool {
        self.nodes[i]
            .command(&["ROLE"])
            .is_some_and(|r| r.lines().next() == Some("master"))
    }

    /// The node that replicates node `master` now, if any.
    pub fn replica_of(&self, master: usize) -> Option<usize> {
        let port = self.nodes[master].port.to_string();
        (0..self.nodes.len()).find(|&i| {
            // A replica's `ROLE`: `slave`, its master's host, then its port.
            self.nodes[i].command(&["ROLE"]).is_some_and(|r| {
                let mut lines = r.lines();
                lines.next() == Some("slave") && lines.nth(1) == Some(port.as_str())
            })
        })
    }

    /// The slots node `i` serves, as it says in `CLUSTER NODES` (none for a replica).
    pub fn slots_of(&self, i: usize) -> Vec<RangeInclusive<u16>> {
        let nodes = self.nodes[i]
            .command(&["CLUSTER", "NODES"])
            .expect("CLUSTER NODES answers");
        let myself = nodes
            .lines()
            .find(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("myself")))
            .expect("a line for the node itself");
        // Fields 8 and on are slots (`0-5460` or `5461`), or slots in migration (`[...]`).
        myself
            .split(' ')
            .skip(8)
            .filter(|s| !s.starts_with('['))
            .map(|s| {
                let (from, to) = s.split_once('-').unwrap_or((s, s));
                let slot = |n: &str| n.trim().parse::<u16>().expect("a slot number");
                slot(from)..=slot(to)
            })
            .collect()
    }

    /// The slot Redis puts `key` in, as `CLUSTER KEYSLOT` on a live node says.
    pub fn slot_of_key(&self, key: &str) -> u16 {
        self.nodes
            .iter()
            .find_map(|n| n.command(&["CLUSTER", "KEYSLOT", key]))
            .and_then(|s| s.trim().parse().ok())
            .expect("CLUSTER KEYSLOT answers on some node")
    }
}
