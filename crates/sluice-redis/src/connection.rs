//! Connections to Redis, whatever the topology, and script calls over them.
//!
//! Every topology multiplexes: concurrent calls share few connections (one per server), and
//! their commands are pipelined on the wire, so a busy instance does not pay a round trip per
//! request in connection setup or head-of-line waiting.
//!
//! - standalone: one `ConnectionManager`, which reconnects by itself after a failure;
//! - Cluster: one `ClusterConnection`, one multiplexed connection per master, following
//!   `MOVED` and `ASK` redirections and slot-map changes;
//! - Sentinel: the master the Sentinels name, behind a `ConnectionManager`; after a failure the
//!   next call asks the Sentinels again, so a failover moves the store to the new master.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    Cmd, ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisError, RedisResult, ServerErrorKind,
    Value,
};

use crate::RedisOptions;
use crate::scripts::Script;
use crate::url::{RedisUrl, Topology};

/// A connection to whichever topology the URL names. Cheap to clone.
#[derive(Clone)]
pub(crate) enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<SentinelConnection>),
}

/// The Sentinel topology: the Sentinels' client and the current master's connection.
pub(crate) struct SentinelConnection {
    client: tokio::sync::Mutex<SentinelClient>,
    master: RwLock<ConnectionManager>,
    /// Set after a failed call: the next call asks the Sentinels where the master is.
    stale: AtomicBool,
    config: ConnectionManagerConfig,
}

fn manager_config(connect_timeout: Duration) -> ConnectionManagerConfig {
    // The store applies its own timeout to every call; the manager only reconnects, briefly.
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        .set_response_timeout(None)
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(100))
}

impl Connection {
    /// Connects to the servers `url` names.
    pub(crate) async fn connect(url: &RedisUrl, options: &RedisOptions) -> RedisResult<Self> {
        let connect_timeout = options.connect_timeout;
        let config = manager_config(connect_timeout);
        let certs = || redis::TlsCertificates {
            client_tls: None,
            root_cert: options.tls_root_cert.clone(),
        };
        if url.tls {
            // rustls needs a process-wide crypto provider; ring is the one compiled in. An
            // error means one is installed already, which is as good.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        match &url.topology {
            Topology::Standalone { host } => {
                let info = connection_info(url, host)?;
                let client = if url.tls {
                    redis::Client::build_with_tls(info, certs())?
                } else {
                    redis::Client::open(info)?
                };
                let manager = ConnectionManager::new_with_config(client, config).await?;
                Ok(Connection::Standalone(manager))
            }
            Topology::Cluster { nodes } => {
                let infos = nodes
                    .iter()
                    .map(|h| connection_info(url, h))
                    .collect::<RedisResult<Vec<_>>>()?;
                let mut builder = redis::cluster::ClusterClient::builder(infos)
                    .connection_timeout(connect_timeout)
                    .retries(1);
                if url.tls {
                    builder = builder.certs(certs());
                }
                let client = builder.build()?;
                Ok(Connection::Cluster(client.get_async_connection().await?))
            }
            Topology::Sentinel { sentinels, master } => {
                let addrs = sentinels
                    .iter()
                    .map(|(h, p)| ConnectionAddr::Tcp(h.clone(), *p));
                let mut builder =
                    SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)?
                        .set_client_to_redis_db(url.db);
                if let Some(u) = &url.username {
                    builder = builder.set_client_to_redis_username(u);
                }
                if let Some(p) = &url.password {
                    builder = builder.set_client_to_redis_password(p);
                }
                if url.tls {
                    builder = builder
                        .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
                        .set_client_to_redis_certificates(certs());
                }
                let mut client = builder.build()?;
                let master_client = client.async_get_client().await?;
                let manager =
                    ConnectionManager::new_with_config(master_client, config.clone()).await?;
                Ok(Connection::Sentinel(Arc::new(SentinelConnection {
                    client: tokio::sync::Mutex::new(client),
                    master: RwLock::new(manager),
                    stale: AtomicBool::new(false),
                    config,
                })))
            }
        }
    }

    /// Sends one command, routed by its first key on a Cluster.
    pub(crate) async fn send(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Connection::Standalone(m) => cmd.query_async(&mut m.clone()).await,
            Connection::Cluster(c) => cmd.query_async(&mut c.clone()).await,
            Connection::Sentinel(s) => {
                let mut master = s.master().await?;
                let result = cmd.query_async(&mut master).await;
                if let Err(e) = &result {
                    if is_transient(e) {
                        s.stale.store(true, Ordering::Release);
                    }
                }
                result
            }
        }
    }

    /// Runs `script` by `EVALSHA`, loading it with `EVAL` when the server does not know it (after
    /// a restart, a failover or `SCRIPT FLUSH`). `EVAL` caches the script as it runs it, so the
    /// next `EVALSHA` finds it: one extra round trip per server per flush.
    pub(crate) async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
    ) -> RedisResult<Value> {
        let call = |name: &str, body: &str| {
            // Sized up front, so that adding the arguments never grows the command's buffers.
            let bytes = name.len()
                + body.len()
                + 20
                + keys.iter().chain(args).map(String::len).sum::<usize>();
            let mut c = Cmd::with_capacity(3 + keys.len() + args.len(), bytes);
            c.arg(name).arg(body).arg(keys.len()).arg(keys).arg(args);
            c
        };
        match self.send(&call("EVALSHA", &script.sha)).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.send(&call("EVAL", &script.body)).await
            }
            other => other,
        }
    }
}

impl SentinelConnection {
    /// The master's connection, asking the Sentinels again if the last call failed.
    async fn master(&self) -> RedisResult<ConnectionManager> {
        if self.stale.load(Ordering::Acquire) {
            let mut client = self.client.lock().await;
            if self.stale.load(Ordering::Acquire) {
                let master = client.async_get_client().await?;
                let manager =
                    ConnectionManager::new_with_config(master, self.config.clone()).await?;
                *self
                    .master
                    .write()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = manager;
                self.stale.store(false, Ordering::Release);
            }
        }
        Ok(self
            .master
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone())
    }
}

/// The client's connection info for one host of `url`.
fn connection_info(
    url: &RedisUrl,
    (host, port): &(String, u16),
) -> RedisResult<redis::ConnectionInfo> {
    let addr = if url.tls {
        ConnectionAddr::TcpTls {
            host: host.clone(),
            port: *port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host.clone(), *port)
    };
    let mut redis_info = redis::RedisConnectionInfo::default().set_db(url.db);
    if let Some(u) = &url.username {
        redis_info = redis_info.set_username(u);
    }
    if let Some(p) = &url.password {
        redis_info = redis_info.set_password(p);
    }
    Ok(addr.into_connection_info()?.set_redis_settings(redis_info))
}

/// Whether an error may go away on its own (the server is down, busy, failing over, or the
/// Cluster is resharding), as opposed to a refusal that retrying cannot fix.
pub(crate) fn is_transient(e: &RedisError) -> bool {
    if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_cluster_error()
    {
        return true;
    }
    match e.kind() {
        ErrorKind::Server(kind) => {
            matches!(
                kind,
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
            ) || e.code() == Some("BUSY")
        }
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => true,
        _ => false,
    }
}
