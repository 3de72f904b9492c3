//! Connections to Redis, whatever the topology, and script calls over them.
//!
//! Every topology multiplexes: concurrent calls share few connections (one per server), and
//! their commands are pipelined on the wire, so a busy instance does not pay a round trip per
//! request in connection setup or head-of-line waiting.
//!
//! - standalone: one `ConnectionManager`, which reconnects by itself after a failure;
//! - Cluster: one `ClusterConnection`, one multiplexed connection per master, following
//!   `MOVED` and `ASK` redirections and slot-map changes; beside it, the store's own map of the
//!   masters ([`Masters`]), with a connection of its own to each, over which a request's script
//!   calls go as one pipeline per master;
//! - Sentinel: the master the Sentinels name, behind a `ConnectionManager`; after a failure the
//!   next call asks the Sentinels again, so a failover moves the store to the new master.
//!
//! On standalone and Sentinel, script calls also go through a batch task that sends the calls
//! made at about the same moment as one pipeline: one write to the socket for many decisions
//! instead of one each (see [`run_batches`]). On a standalone server over plain TCP, the batch
//! task owns a connection of its own for them ([`crate::pipe`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::ThreadId;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;

use redis::aio::ConnectionLike;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    Arg, Cmd, ConnectionAddr, ErrorKind, FromRedisValue, IntoConnectionInfo, Pipeline, RedisError,
    RedisResult, ServerErrorKind, Value,
};
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::RedisOptions;
use crate::masters::Masters;
use crate::pipe::{self, Dial};
use crate::scripts::Script;
use crate::url::{RedisUrl, Topology};

/// A connection to whichever topology the URL names. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Connection {
    link: Link,
    /// Where script calls queue for a batch task; `None` on a Cluster, whose calls are grouped
    /// by master instead.
    batches: Option<Arc<Batches>>,
    /// On a Cluster: which master serves each slot, with a connection and a breaker for each.
    masters: Option<Arc<Masters>>,
}

/// The batch tasks of one connection: one on the runtime that connected, and one on each
/// single-threaded runtime that has made a call.
///
/// The gRPC service runs on single-threaded runtimes of its own (`sluice-server`'s
/// `grpc_workers`). Their calls, sent to a task on the main runtime, made two wake-ups across
/// threads per decision: a thread woken through its event descriptor, and a context switch when
/// both threads share a core. A batch task on the caller's own runtime hands its calls to the
/// connection as one pipeline and gets one reply back, so only the pipeline crosses threads.
pub(crate) struct Batches {
    /// The task on the runtime that connected, for calls from multi-threaded runtimes.
    shared: mpsc::UnboundedSender<Call>,
    /// Tasks on single-threaded runtimes, by thread; each started by the first call made there.
    local: Mutex<Vec<(ThreadId, mpsc::UnboundedSender<Call>)>>,
    sink: Sink,
}

/// Where a batch task sends its calls.
#[derive(Clone)]
pub(crate) enum Sink {
    /// A connection of the batch task's own ([`crate::pipe`]): a standalone server over TCP.
    Own(Arc<Dial>),
    /// The `redis` crate's connection: TLS, or a Sentinel's master.
    Crate(Link),
}

/// The connection proper, per topology.
#[derive(Clone)]
pub(crate) enum Link {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<SentinelConnection>),
}

/// A request to Redis: one command, or a pipeline of them.
#[derive(Clone, Copy)]
enum Request<'a> {
    Cmd(&'a Cmd),
    Pipeline(&'a Pipeline),
}

/// One script call waiting for the batch task.
pub(crate) struct Call {
    /// `EVALSHA sha numkeys keys… args…`, packed for the wire ([`pipe::pack_eval_sha`]).
    pub(crate) command: Vec<u8>,
    pub(crate) script: &'static Script,
    /// When the caller stops waiting: it is answered with a timeout then, if Redis has not
    /// answered first.
    pub(crate) deadline: Instant,
    pub(crate) reply: oneshot::Sender<RedisResult<Value>>,
}

/// The most calls one pipeline carries; a longer queue goes out as several.
pub(crate) const MAX_BATCH: usize = 256;

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
    /// Connects to the servers `url` names, and off a Cluster starts the batch task.
    pub(crate) async fn connect(url: &RedisUrl, options: &RedisOptions) -> RedisResult<Self> {
        let home = Home::here();
        let link = Link::connect(url, options).await?;
        let masters = match &link {
            Link::Cluster(cluster) => Some(
                Masters::load(cluster.clone(), url.clone(), options.clone(), home.clone()).await,
            ),
            Link::Standalone(_) | Link::Sentinel(_) => None,
        };
        let sink = match (&link, &url.topology) {
            (Link::Cluster(_), _) => None,
            (Link::Standalone(_), Topology::Standalone { host }) if !url.tls => Some(Sink::Own(
                Arc::new(Dial::new(url, host, options.connect_timeout)),
            )),
            (Link::Standalone(_) | Link::Sentinel(_), _) => Some(Sink::Crate(link.clone())),
        };
        let batches = sink.map(|sink| Batches::start(sink, &home));
        Ok(Connection {
            link,
            batches,
            masters,
        })
    }

    /// On a Cluster, its masters as this store routes to them.
    pub(crate) fn masters(&self) -> Option<&Arc<Masters>> {
        self.masters.as_ref()
    }

    /// Sends one command, routed by its first key on a Cluster.
    pub(crate) async fn send(&self, cmd: &Cmd) -> RedisResult<Value> {
        self.link.query(Request::Cmd(cmd)).await
    }

    /// Runs `script` by `EVALSHA`, loading it with `EVAL` when the server does not know it (after
    /// a restart, a failover or `SCRIPT FLUSH`). `EVAL` caches the script as it runs it, so the
    /// next `EVALSHA` finds it: one extra round trip per server per flush.
    ///
    /// The call is answered by `deadline`: with a timeout error (see [`timed_out`]) if Redis
    /// has not answered by then. Off a Cluster it joins the batch task's next pipeline, and the
    /// batch task keeps the time, so that a decision arms no timer of its own.
    pub(crate) async fn eval<A: AsRef<[u8]>>(
        &self,
        script: &'static Script,
        keys: &[String],
        args: &[A],
        deadline: Instant,
    ) -> RedisResult<Value> {
        let Some(batches) = &self.batches else {
            // On the heap: the crate's call is a large future, and this one is awaited in place
            // by every decision on a batched connection.
            let cmd = eval_sha_cmd(script, keys, args);
            return Box::pin(self.link.eval_sha_by(&cmd, script, deadline)).await;
        };
        batches.eval(script, keys, args, deadline).await
    }
}

/// `EVALSHA sha numkeys keys… args…` for `script`.
pub(crate) fn eval_sha_cmd<A: AsRef<[u8]>>(
    script: &'static Script,
    keys: &[String],
    args: &[A],
) -> Cmd {
    // Sized up front, so that adding the arguments never grows the command's buffers.
    let bytes = script.sha.len()
        + 20
        + keys.iter().map(String::len).sum::<usize>()
        + args.iter().map(|a| a.as_ref().len()).sum::<usize>();
    let mut cmd = Cmd::with_capacity(3 + keys.len() + args.len(), bytes);
    cmd.arg("EVALSHA")
        .arg(&script.sha)
        .arg(keys.len())
        .arg(keys);
    for a in args {
        cmd.arg(a.as_ref());
    }
    cmd
}

/// The runtime that connected: where a connection's shared batch task runs, even when the first
/// call that needs the task (a Cluster master's, started on first use) comes from another
/// runtime, which may stop before the connection does.
#[derive(Clone)]
pub(crate) struct Home {
    runtime: Handle,
    /// Its thread, when it is single-threaded: that thread's calls go to the shared task.
    thread: Option<ThreadId>,
}

impl Home {
    /// The caller's runtime. Called from within one (a connection is made in async code).
    pub(crate) fn here() -> Home {
        Home {
            runtime: Handle::current(),
            thread: on_single_threaded_runtime().then(|| std::thread::current().id()),
        }
    }
}

impl Batches {
    /// Starts the shared batch task for `sink` on `home`'s runtime.
    pub(crate) fn start(sink: Sink, home: &Home) -> Arc<Batches> {
        let shared = start_batches(&sink, &home.runtime);
        let local = home
            .thread
            .map(|t| (t, shared.clone()))
            .into_iter()
            .collect();
        Arc::new(Batches {
            shared,
            local: Mutex::new(local),
            sink,
        })
    }

    /// Runs `script` by `EVALSHA` in the next pipeline of the caller's batch task (by `EVAL`
    /// when the server does not know it), answered by `deadline`.
    pub(crate) async fn eval<A: AsRef<[u8]>>(
        &self,
        script: &'static Script,
        keys: &[String],
        args: &[A],
        deadline: Instant,
    ) -> RedisResult<Value> {
        let (reply, answer) = oneshot::channel();
        let call = Call {
            command: pipe::pack_eval_sha(script, keys, args),
            script,
            deadline,
            reply,
        };
        if self.send(call).is_err() {
            return Err(batch_task_gone());
        }
        answer.await.unwrap_or_else(|_| Err(batch_task_gone()))
    }

    /// Queues `call` for the batch task of the caller's runtime.
    fn send(&self, call: Call) -> Result<(), mpsc::error::SendError<Call>> {
        if !on_single_threaded_runtime() {
            return self.shared.send(call);
        }
        let thread = std::thread::current().id();
        let mut local = self.local.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, queue)) = local.iter().find(|(t, q)| *t == thread && !q.is_closed()) {
            return queue.send(call);
        }
        // A task whose runtime has stopped (a closed queue) goes, and one starts here.
        local.retain(|(t, q)| *t != thread && !q.is_closed());
        let queue = start_batches(&self.sink, &Handle::current());
        let sent = queue.send(call);
        local.push((thread, queue));
        sent
    }
}

/// Starts a batch task on `runtime`, and returns its queue.
fn start_batches(sink: &Sink, runtime: &Handle) -> mpsc::UnboundedSender<Call> {
    let (queue, calls) = mpsc::unbounded_channel();
    match sink {
        Sink::Own(dial) => runtime.spawn(pipe::run(dial.clone(), calls)),
        Sink::Crate(link) => runtime.spawn(run_batches(link.clone(), calls)),
    };
    queue
}

/// Whether the caller runs on a single-threaded tokio runtime.
fn on_single_threaded_runtime() -> bool {
    Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::CurrentThread)
}

/// The error a call gets when the batch task stops without answering it: the runtime that ran
/// the task is shutting down.
fn batch_task_gone() -> RedisError {
    std::io::Error::new(
        std::io::ErrorKind::BrokenPipe,
        "no answer from the redis batch task: it has stopped",
    )
    .into()
}

/// The error a script call gets when its deadline passes before Redis answers; a timeout to
/// [`RedisError::is_timeout`].
pub(crate) fn timed_out() -> RedisError {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "redis did not answer before the call's deadline",
    )
    .into()
}

/// The batch task: takes the script calls queued on a connection and sends those that arrived
/// together as one pipeline, while earlier pipelines wait for their replies.
///
/// When the first call of a batch arrives, the task yields once before it takes the queue. Tokio
/// runs a woken task right after the task that woke it, so without the yield every request
/// would wake the task and leave in a pipeline of its own; with it, every task that is ready
/// runs first, and the calls they make go out together: one write to the socket and one wake-up
/// of Redis for all of them. Each call is still its own atomic script; only the trip is shared.
/// A lone call costs one more hop between tasks.
///
/// The task also keeps the callers' time: a batch arms one timer, for the earliest deadline of
/// its calls, where a timer per call would cost a decision a timer-wheel entry (and, on a
/// single-threaded runtime, often a wake-up of its own driver). See [`answer_batch`].
async fn run_batches(link: Link, mut queue: mpsc::UnboundedReceiver<Call>) {
    let mut in_flight = FuturesUnordered::new();
    loop {
        tokio::select! {
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
            first = queue.recv() => {
                let Some(first) = first else { break };
                tokio::task::yield_now().await;
                let mut calls = vec![first];
                while calls.len() < MAX_BATCH {
                    match queue.try_recv() {
                        Ok(call) => calls.push(call),
                        Err(_) => break,
                    }
                }
                in_flight.push(answer_batch(link.clone(), calls));
            }
        }
    }
    while in_flight.next().await.is_some() {}
}

/// Sends `calls` (see [`send_batch`]) and answers each caller with its result, or with a
/// timeout once its deadline passes: the batch is timed by its earliest deadline, and when that
/// passes first, the callers whose time is up are answered and the rest wait on.
async fn answer_batch(link: Link, mut calls: Vec<Call>) {
    if calls.len() == 1 {
        // A lone call (light load) goes as itself, without the pipeline's buffers.
        let Call {
            command,
            script,
            deadline,
            reply,
        } = calls.pop().expect("one call");
        let cmd = unpacked(&command);
        let _ = reply.send(link.eval_sha_by(&cmd, script, deadline).await);
        return;
    }
    let mut waiting: Vec<(Instant, Option<oneshot::Sender<RedisResult<Value>>>)> =
        Vec::with_capacity(calls.len());
    let mut pipeline = Pipeline::with_capacity(calls.len());
    pipeline.ignore_errors();
    let mut scripts = Vec::with_capacity(calls.len());
    for call in calls {
        pipeline.add_command(unpacked(&call.command));
        scripts.push(call.script);
        waiting.push((call.deadline, Some(call.reply)));
    }
    let send = send_batch(&link, &pipeline, &scripts);
    tokio::pin!(send);
    loop {
        let Some(next) = waiting
            .iter()
            .filter(|(_, reply)| reply.is_some())
            .map(|(deadline, _)| *deadline)
            .min()
        else {
            return;
        };
        match tokio::time::timeout_at(next, send.as_mut()).await {
            Ok(results) => {
                for ((_, reply), result) in waiting.into_iter().zip(results) {
                    if let Some(reply) = reply {
                        let _ = reply.send(result);
                    }
                }
                return;
            }
            Err(_) => {
                let now = Instant::now();
                for (deadline, reply) in &mut waiting {
                    if *deadline <= now {
                        if let Some(reply) = reply.take() {
                            let _ = reply.send(Err(timed_out()));
                        }
                    }
                }
            }
        }
    }
}

/// Sends the `EVALSHA`s in `pipe` as one pipeline, and retries those the server did not know
/// the script of (`scripts`, in the same order) with `EVAL`.
async fn send_batch(
    link: &Link,
    pipe: &Pipeline,
    scripts: &[&'static Script],
) -> Vec<RedisResult<Value>> {
    let cmds: Vec<&Cmd> = pipe.cmd_iter().collect();
    let mut results: Vec<RedisResult<Value>> = match link
        .query::<Vec<RedisResult<Value>>>(Request::Pipeline(pipe))
        .await
    {
        Ok(results) if results.len() == cmds.len() => results,
        Ok(results) => {
            let e = RedisError::from((
                ErrorKind::Client,
                "a pipeline of script calls",
                format!("{} replies to {} calls", results.len(), cmds.len()),
            ));
            vec![Err(e); cmds.len()]
        }
        Err(e) => vec![Err(e); cmds.len()],
    };
    let unknown: Vec<usize> = (0..results.len())
        .filter(|&i| matches!(&results[i], Err(e) if is_no_script(e)))
        .collect();
    if !unknown.is_empty() {
        let retried = join_all(unknown.iter().map(|&i| {
            let eval = with_body(cmds[i], scripts[i]);
            async move { link.query(Request::Cmd(&eval)).await }
        }))
        .await;
        for (i, r) in unknown.into_iter().zip(retried) {
            results[i] = r;
        }
    }
    results
}

/// A command packed by [`pipe::pack_eval_sha`], as the `redis` crate's.
fn unpacked(command: &[u8]) -> Cmd {
    let parts = pipe::unpack(command);
    let mut cmd = Cmd::with_capacity(parts.len(), command.len());
    for part in parts {
        cmd.arg(part);
    }
    cmd
}

pub(crate) fn is_no_script(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// `cmd`, an `EVALSHA`, as the `EVAL` of `script` with the same keys and arguments.
pub(crate) fn with_body(cmd: &Cmd, script: &Script) -> Cmd {
    let mut eval = redis::cmd("EVAL");
    eval.arg(&script.body);
    for arg in cmd.args_iter().skip(2) {
        if let Arg::Simple(bytes) = arg {
            eval.arg(bytes);
        }
    }
    eval
}

impl Link {
    /// Connects to the servers `url` names.
    async fn connect(url: &RedisUrl, options: &RedisOptions) -> RedisResult<Self> {
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
                Ok(Link::Standalone(open_manager(url, host, options).await?))
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
                Ok(Link::Cluster(client.get_async_connection().await?))
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
                Ok(Link::Sentinel(Arc::new(SentinelConnection {
                    client: tokio::sync::Mutex::new(client),
                    master: RwLock::new(manager),
                    stale: AtomicBool::new(false),
                    config,
                })))
            }
        }
    }

    /// Sends `request`, routed by its first key on a Cluster.
    async fn query<T: FromRedisValue>(&self, request: Request<'_>) -> RedisResult<T> {
        match self {
            Link::Standalone(m) => request.run(&mut m.clone()).await,
            Link::Cluster(c) => request.run(&mut c.clone()).await,
            Link::Sentinel(s) => {
                let mut master = s.master().await?;
                let result = request.run(&mut master).await;
                if let Err(e) = &result {
                    if is_transient(e) {
                        s.stale.store(true, Ordering::Release);
                    }
                }
                result
            }
        }
    }

    /// Sends `cmd`, an `EVALSHA` of `script`, and sends it again as `EVAL` when the server
    /// does not know the script.
    async fn eval_sha(&self, cmd: &Cmd, script: &Script) -> RedisResult<Value> {
        match self.query(Request::Cmd(cmd)).await {
            Err(e) if is_no_script(&e) => self.query(Request::Cmd(&with_body(cmd, script))).await,
            other => other,
        }
    }

    /// [`Link::eval_sha`], answered with a timeout (see [`timed_out`]) if `deadline` passes
    /// first.
    async fn eval_sha_by(
        &self,
        cmd: &Cmd,
        script: &Script,
        deadline: Instant,
    ) -> RedisResult<Value> {
        tokio::time::timeout_at(deadline, self.eval_sha(cmd, script))
            .await
            .unwrap_or_else(|_| Err(timed_out()))
    }
}

impl Request<'_> {
    async fn run<T: FromRedisValue>(self, con: &mut impl ConnectionLike) -> RedisResult<T> {
        match self {
            Request::Cmd(cmd) => cmd.query_async(con).await,
            Request::Pipeline(pipe) => pipe.query_async(con).await,
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

/// A `ConnectionManager` to one server, `host`, with the credentials, database and TLS of
/// `url`: the server of a standalone URL, or one master of a Cluster.
pub(crate) async fn open_manager(
    url: &RedisUrl,
    host: &(String, u16),
    options: &RedisOptions,
) -> RedisResult<ConnectionManager> {
    let info = connection_info(url, host)?;
    let client = if url.tls {
        // See `Link::connect`: an error means a provider is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        redis::Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: options.tls_root_cert.clone(),
            },
        )?
    } else {
        redis::Client::open(info)?
    };
    ConnectionManager::new_with_config(client, manager_config(options.connect_timeout)).await
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

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::scripts::HEARTBEAT;
    use crate::testing::{RedisServer, test_options};

    /// Two calls in one batch keep their own deadlines: while Redis is paused, the call whose
    /// deadline comes first is answered with a timeout at its deadline, and the other waits on
    /// and gets Redis's answer once the pause ends.
    #[tokio::test]
    async fn calls_in_one_batch_time_out_each_at_its_own_deadline() {
        let server = RedisServer::start();
        let url = RedisUrl::parse(&server.url()).unwrap();
        let connection = Connection::connect(&url, &test_options()).await.unwrap();
        let beat = |id: &'static str, within: Duration| {
            let connection = connection.clone();
            tokio::spawn(async move {
                let (keys, args) = (
                    ["beats".to_owned()],
                    ["0".to_owned(), id.to_owned(), "60000".to_owned()],
                );
                let deadline = Instant::now() + within;
                let result = connection.eval(&HEARTBEAT, &keys, &args, deadline).await;
                (result, Instant::now())
            })
        };
        // Known to the server, so that the paused calls are plain EVALSHAs.
        assert!(
            beat("warm", Duration::from_secs(5))
                .await
                .unwrap()
                .0
                .is_ok()
        );

        server.command(&["CLIENT", "PAUSE", "2000", "ALL"]).unwrap();
        let paused = Instant::now();
        // Spawned together, on one thread: the batch task takes both into one pipeline.
        let (early, late) = (
            beat("early", Duration::from_millis(100)),
            beat("late", Duration::from_secs(30)),
        );
        let (early, early_at) = early.await.unwrap();
        let e = early.expect_err("redis is paused");
        assert!(e.is_timeout(), "{e}");
        assert!(
            early_at - paused < Duration::from_millis(1_500),
            "{:?}",
            early_at - paused
        );
        assert!(!late.is_finished(), "the later deadline is still running");
        let (late, late_at) = late.await.unwrap();
        // Three instances: the early call timed out for its caller, but it had left, and Redis
        // ran it after the pause, as it runs any command sent before a timeout.
        assert_eq!(late.unwrap(), Value::Int(3));
        assert!(late_at > early_at);
    }
}
