//! Serving connections with the limits a public listener needs: a client must send its request
//! head within a time (a slowloris holding connections open by trickling headers is closed, an
//! h2 one too: [`header_blocks`](crate::header_blocks)), an
//! h2 client that stops answering pings is dropped, one that sends nothing or stays idle is
//! closed ([`connection_deadlines`](crate::connection_deadlines)), connections are capped in total and per
//! client address, running out of file descriptors slows accepting instead of spinning, and
//! stopping lets the requests in flight finish. The service, the gateway and the gateway's admin
//! listener all serve through here.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::Request;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tower_service::Service;

use crate::PeerAddr;
use crate::connection_deadlines::{Activity, Tracked, drive};
use crate::h1_server::{self, Fields};
use crate::header_blocks::HeaderBlocks;
use crate::request_body::RequestBody;
use crate::send_progress::SendProgress;

/// How many connections a listener holds, and how long they may take and stay idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// From the connection's start, or the end of the previous answer on a kept-alive one, until
    /// the next request's head is complete. A connection that takes longer is closed.
    pub header_read: Duration,
    /// How often an idle h2 connection is pinged; one that does not answer within as long again
    /// is closed.
    pub h2_keep_alive: Duration,
    /// How long a connection may go with no request in flight before it is closed (gracefully:
    /// an h2 client is sent `GOAWAY`). A client that answers pings is otherwise held for ever.
    pub idle: Duration,
    /// How long what a connection has to send may make no progress (its socket takes no byte,
    /// or an answer waits to be asked for its next part) before the connection is dropped: a
    /// client that never reads is otherwise held, with the answers not yet written, for ever.
    /// See [`send_progress`](crate::send_progress).
    pub send: Duration,
    /// Open connections at most; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Open connections from one client address at most. Behind a load balancer every
    /// connection comes from its few addresses: raise it there.
    pub max_per_ip: usize,
    /// When the listener stops, how long an HTTP/1.1 connection with nothing in flight is
    /// still read: a request already sent on it is answered (with `Connection: close`), not
    /// cut off unread. See [`connection_deadlines`](crate::connection_deadlines).
    pub drain: Duration,
}

impl Default for ConnectionLimits {
    /// 10 s for a request head (nginx's `client_header_timeout` is 60 s; a rate limiter's clients
    /// send small heads), a ping every 30 s, closed after 5 minutes idle (Envoy's own idle
    /// timeout for upstream connections is an hour; a client whose connection is closed opens
    /// another), 30 s without progress in sending (nginx's `send_timeout` is 60 s; an answer
    /// of Sluice's fits in a socket buffer, so only a client that stopped reading waits that
    /// long), 16,384 connections, 1,024 from one address, and 1 s to drain on stopping (far
    /// longer than a request already sent takes to arrive; a client that sends nothing in it
    /// is closed while idle, which every HTTP/1.1 client must expect).
    fn default() -> Self {
        ConnectionLimits {
            header_read: Duration::from_secs(10),
            h2_keep_alive: Duration::from_secs(30),
            idle: Duration::from_secs(300),
            send: Duration::from_secs(30),
            max_connections: 16_384,
            max_per_ip: 1_024,
            drain: Duration::from_secs(1),
        }
    }
}

/// Streams one h2 connection may have open at once, on every listener (hyper's default, which
/// the HTTP listeners always had; the gRPC one had none). Each stream past it is refused with
/// `REFUSED_STREAM`, which a client may retry: nothing of it was served.
pub const H2_MAX_STREAMS: u32 = 200;

/// How long accepting pauses when the process is out of file descriptors.
const EMFILE_BACKOFF: Duration = Duration::from_millis(100);
/// A service a listener can serve: it answers every request (a refusal is an answer, never an
/// error), and it is cloned into each connection's task. One name for the bounds that
/// [`serve_connections`] and the lifecycle's `serve` and `listen` share.
pub trait HttpService<B>:
    Service<
        Request<RequestBody>,
        Response = http::Response<B>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S, B> HttpService<B> for S where
    S: Service<
            Request<RequestBody>,
            Response = http::Response<B>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// A body a listener can send: its chunks and errors cross threads.
pub trait ResponseBody:
    http_body::Body<Data: Send, Error: Into<Box<dyn std::error::Error + Send + Sync>>> + Send + 'static
{
}

impl<B> ResponseBody for B where
    B: http_body::Body<Data: Send, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + Send
        + 'static
{
}

/// The least time between two log lines about the same refusal.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Accepts connections on `listener` until `stopped` turns true, serving each with `service`
/// (HTTP/1.1 and h2), then lets the requests in flight finish, and answers those already sent
/// on an idle HTTP/1.1 connection within [`ConnectionLimits::drain`]. Each request carries the peer's
/// address as [`PeerAddr`], which axum handlers extract as they would `ConnectInfo`.
pub async fn serve_connections<S, B>(
    listener: TcpListener,
    service: S,
    stopped: watch::Receiver<bool>,
    limits: ConnectionLimits,
) where
    S: HttpService<B>,
    B: ResponseBody,
{
    let for_peer = move |peer| WithPeer {
        service: service.clone(),
        peer,
    };
    serve_connections_with(listener, for_peer, Fields::All, stopped, limits).await;
}

/// As [`serve_connections`], but each connection is served by the service `for_peer` makes for
/// its peer, and its requests carry no [`PeerAddr`]: a service that needs the peer for only
/// some requests is told it once a connection, where the extension costs an allocation, a
/// hash map's insertion and its drop in every request (about 800 instructions of a `/json`
/// answer's 21,000). Requests `fields` says the service never reads the fields of are handed
/// over without them ([`Fields`]).
pub async fn serve_connections_with<F, S, B>(
    listener: TcpListener,
    for_peer: F,
    fields: Fields,
    mut stopped: watch::Receiver<bool>,
    limits: ConnectionLimits,
) where
    F: Fn(SocketAddr) -> S,
    S: HttpService<B>,
    B: ResponseBody,
{
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        // No header timer of hyper's: a kept-alive connection's later heads are bounded by its
        // deadline loop (`connection_deadlines`), as its first is, with no timer armed and
        // cancelled per request. hyper's would otherwise default to 30 s once given a timer.
        .header_read_timeout(None)
        // An answer's head and its body in one buffer, written with one `write`: cheaper than
        // queueing them for `writev` (445 instructions per proxied request under callgrind)
        // while bodies are small, as a rate limiter's and most APIs' are; a large body costs
        // one copy more.
        .writev(false);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .keep_alive_interval(limits.h2_keep_alive)
        .keep_alive_timeout(limits.h2_keep_alive);
    let hyper = Arc::new(builder);
    // Every connection's task holds a clone; stopping waits until all are dropped.
    let (open, mut all_closed) = mpsc::channel::<()>(1);
    let mut admission = Admission::new(limits);
    // Its own log, so that a burst of refusals never holds back this line or mixes the counts.
    let mut out_of_descriptors = RateLimitedLog::default();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|s| *s) => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) if is_out_of_descriptors(&e) => {
                // Connections already open go on being served; new ones wait in the backlog
                // until one closes.
                out_of_descriptors.log(|n| {
                    tracing::warn!(
                        error = %e,
                        repeated = n,
                        "out of file descriptors: accepting paused; raise the open-files limit or lower --max-connections"
                    );
                });
                tokio::time::sleep(EMFILE_BACKOFF).await;
                continue;
            }
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                continue;
            }
        };
        let Some(slot) = admission.admit(peer) else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = for_peer(peer);
        let activity = Activity::new();
        let seen = activity.clone();
        // Every request is in flight until its answer is sent.
        let answer = move |request: Request<RequestBody>| {
            let version = request.version();
            let in_flight = seen.begin(version);
            let mut service = service.clone();
            async move {
                std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
                let mut answer = service.call(request).await?;
                // Answered while the listener drains: the client must not send another
                // request on this connection, which is about to close.
                if in_flight.draining() && version < http::Version::HTTP_2 {
                    answer.headers_mut().insert(
                        http::header::CONNECTION,
                        http::HeaderValue::from_static("close"),
                    );
                }
                Ok::<_, Infallible>(answer.map(|body| Tracked::new(body, in_flight)))
            }
        };
        let stream = HeaderBlocks::new(
            SendProgress::new(stream, activity.clone()),
            activity.clone(),
        );
        // HTTP/1.1's common case on the connection's own task; the rest, h2 included, by
        // hyper (`h1_server`).
        let connection = h1_server::serve(stream, answer, fields, Arc::clone(&hyper));
        let (stopped, open) = (stopped.clone(), open.clone());
        tokio::spawn(async move {
            if let Err(e) = drive(connection, activity, limits, stopped).await {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
            drop((slot, open));
        });
    }
    drop(listener);
    drop(open);
    let _ = all_closed.recv().await;
}

/// `service`, with each request given the connection's `peer` as [`PeerAddr`]: one
/// extension, not axum's `ConnectInfo` as well (each costs an allocation per request), and
/// `PeerAddr` extracts in axum handlers too.
#[derive(Debug, Clone)]
struct WithPeer<S> {
    service: S,
    peer: SocketAddr,
}

impl<S> Service<Request<RequestBody>> for WithPeer<S>
where
    S: Service<Request<RequestBody>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.service.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<RequestBody>) -> S::Future {
        request.extensions_mut().insert(PeerAddr(self.peer));
        self.service.call(request)
    }
}

fn is_out_of_descriptors(e: &std::io::Error) -> bool {
    // EMFILE (the process's limit) and ENFILE (the system's).
    matches!(e.raw_os_error(), Some(24 | 23))
}

/// Which connections a listener keeps: at most [`ConnectionLimits::max_connections`] open, and
/// [`ConnectionLimits::max_per_ip`] from one address. A refusal is logged, at most once every
/// 10 s with how many there were.
#[derive(Debug)]
pub struct Admission {
    open: Arc<OpenConnections>,
    limits: ConnectionLimits,
    refusals: RateLimitedLog,
}

impl Admission {
    /// Nothing open yet, under `limits`.
    pub fn new(limits: ConnectionLimits) -> Self {
        Admission {
            open: Arc::new(OpenConnections::default()),
            limits,
            refusals: RateLimitedLog::default(),
        }
    }

    /// A place for a connection just accepted from `peer`, held until the [`Slot`] is dropped;
    /// `None` when the limits leave none, and the connection should be closed.
    pub fn admit(&mut self, peer: SocketAddr) -> Option<Slot> {
        let slot = self.open.take(peer.ip(), &self.limits);
        if slot.is_none() {
            self.refusals.log(|n| {
                tracing::warn!(
                    %peer,
                    repeated = n,
                    "connection refused: at --max-connections or --max-connections-per-ip"
                );
            });
        }
        slot
    }
}

/// Open connections, in total and by client address.
#[derive(Debug, Default)]
struct OpenConnections {
    by_ip: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

impl OpenConnections {
    /// A place for one more connection from `ip`, if the limits leave one.
    fn take(self: &Arc<Self>, ip: IpAddr, limits: &ConnectionLimits) -> Option<Slot> {
        let mut guard = self.by_ip.lock().unwrap_or_else(PoisonError::into_inner);
        let (total, by_ip) = &mut *guard;
        let mine = by_ip.entry(ip).or_insert(0);
        if *total >= limits.max_connections || *mine >= limits.max_per_ip {
            if *mine == 0 {
                by_ip.remove(&ip);
            }
            return None;
        }
        *mine += 1;
        *total += 1;
        Some(Slot {
            open: Arc::clone(self),
            ip,
        })
    }
}

/// One open connection's place; given back when dropped.
#[derive(Debug)]
pub struct Slot {
    open: Arc<OpenConnections>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut guard = self
            .open
            .by_ip
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (total, by_ip) = &mut *guard;
        *total = total.saturating_sub(1);
        if let Some(n) = by_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                by_ip.remove(&self.ip);
            }
        }
    }
}

/// Logs a repeated event at most once per [`LOG_EVERY`], with how often it happened between.
#[derive(Debug, Default)]
struct RateLimitedLog {
    last: Option<Instant>,
    since: u64,
}

impl RateLimitedLog {
    fn log(&mut self, emit: impl FnOnce(u64)) {
        self.since += 1;
        if self.last.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            emit(self.since);
            self.since = 0;
            self.last = Some(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_capped_in_total_and_per_address_and_given_back() {
        let open = Arc::new(OpenConnections::default());
        let limits = ConnectionLimits {
            max_connections: 3,
            max_per_ip: 2,
            ..Default::default()
        };
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = (
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            "10.0.0.3".parse().unwrap(),
        );
        let a1 = open.take(a, &limits).unwrap();
        let _a2 = open.take(a, &limits).unwrap();
        assert!(open.take(a, &limits).is_none(), "per address");
        let _b1 = open.take(b, &limits).unwrap();
        assert!(open.take(c, &limits).is_none(), "in total");
        drop(a1);
        assert!(
            open.take(c, &limits).is_some(),
            "a closed connection gives its place back"
        );
        // A refused address leaves nothing behind.
        let guard = open.by_ip.lock().unwrap();
        assert_eq!(guard.1.len(), 2, "{:?}", guard.1);
    }

    #[test]
    fn a_repeated_event_is_logged_once_with_its_count() {
        let mut log = RateLimitedLog::default();
        let mut emitted = Vec::new();
        for _ in 0..5 {
            log.log(|n| emitted.push(n));
        }
        assert_eq!(emitted, [1]);
        assert_eq!(log.since, 4);
    }
}
