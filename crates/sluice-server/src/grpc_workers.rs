//! Where the gRPC service's connections are served: on a few single-threaded runtimes, one per
//! CPU the process may run on, each connection on one of them for its whole life, by hyper's h2
//! server with the services routed by path.
//!
//! On the shared multi-threaded runtime, every h2 stream is a task of its own, and a stream
//! that finishes wakes its connection's task, which tokio runs next (the worker's LIFO slot):
//! the connection writes that one answer, then the next stream finishes and wakes it again. So
//! each answer cost its own `write`, even with many streams in flight on one connection, and a
//! connection woken that way jumped ahead of the ones waiting, which made the tail unfair
//! (issue #15: p99 at 512 in flight 2.7× Limitador's). A single-threaded runtime runs woken
//! tasks in the order they were woken: the streams a read brought in are decided one after
//! another, and their connection writes all their answers in one `write` when its turn comes.
//! Limitador serves its gRPC the same way (on actix's single-threaded runtime).
//!
//! **Why not tonic's server.** tonic's transport puts a router (axum's, with its path
//! parameters), a timeout layer, connection-info extensions and a boxed body around every
//! request. The service has three gRPC services, told apart by the first segment of the path, so
//! it routes itself and hands hyper the generated tonic services as they are: 53,700
//! instructions per `ShouldRateLimit` under callgrind at 128 connections, against 60,900
//! through tonic's server. `ShouldRateLimit` itself, the call Envoy makes, skips tonic's
//! generic unary machinery too ([`unary`](crate::unary)). TLS is rustls through
//! `tokio-rustls`, as in tonic. A client's
//! `grpc-timeout` is not enforced here: a decision does not wait on anything but the store,
//! which has its own timeout, and the client stops waiting at its deadline anyway.
//!
//! A connection's first request must arrive within `--header-timeout` of connecting (TLS
//! handshake and h2 preface included), one idle for `--idle-timeout` is closed with `GOAWAY`
//! ([`connection_deadlines`](sluice_http::connection_deadlines)), as is one whose later
//! request's header block stays open that long ([`HeaderBlocks`]), at most
//! [`H2_MAX_STREAMS`] streams are open on one, and a request's message must be complete within
//! `--header-timeout` of its head ([`BodyDeadline`]).
//!
//! Connections are accepted on the caller's runtime and handed out in turn. Everything the
//! service shares with the rest of the process (the limiter, its store and metrics) is
//! `Send + Sync` and does not care which runtime calls it.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::thread::JoinHandle;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use sluice_http::connection_deadlines::{Activity, Tracked, drive};
use sluice_http::header_blocks::HeaderBlocks;
use sluice_http::send_progress::SendProgress;
use sluice_http::serve::{Admission, ConnectionLimits, H2_MAX_STREAMS, Slot};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tonic::server::NamedService;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::HealthService;
use tower_service::Service;

use crate::body_deadline::BodyDeadline;
use crate::grpc::RlsService;
use crate::reservations::ReservationsService;
use crate::sluice_v1::reservations_server::ReservationsServer;
use crate::unary;

/// What every gRPC connection is served with.
#[derive(Clone)]
pub(crate) struct Serving {
    /// The services.
    pub(crate) routes: GrpcRoutes,
    /// TLS, when the listener has it; the handshake, and the first request's head after it, must
    /// end within `limits.header_read` of connecting.
    pub(crate) tls: Option<tokio_rustls::TlsAcceptor>,
    /// The h2 pings (`h2_keep_alive`), the handshake's time (`header_read`), and the open
    /// connections in total and from one address, as on the HTTP listener.
    pub(crate) limits: ConnectionLimits,
}

/// The gRPC services, chosen by the first segment of the request's path.
#[derive(Clone)]
pub(crate) struct GrpcRoutes {
    /// `ShouldRateLimit`, answered by [`unary`](crate::unary).
    pub(crate) service: Arc<RlsService>,
    /// The rest of `envoy.service.ratelimit.v3.RateLimitService`.
    pub(crate) rls: RateLimitServiceServer<RlsService>,
    /// `sluice.v1.Reservations`.
    pub(crate) reservations: ReservationsServer<ReservationsService>,
    /// `grpc.health.v1.Health`.
    pub(crate) health: HealthServer<HealthService>,
}

type GrpcResponse = http::Response<tonic::body::Body>;
type GrpcFuture = Pin<Box<dyn Future<Output = Result<GrpcResponse, Infallible>> + Send>>;

impl GrpcRoutes {
    /// The answer to `request`: from the service its path names, or `UNIMPLEMENTED`. An
    /// unknown method of a known service is the generated service's to answer (also
    /// `UNIMPLEMENTED`).
    fn route(&self, request: Request<BodyDeadline<Incoming>>) -> GrpcFuture {
        let path = request.uri().path();
        if path == unary::PATH {
            let service = Arc::clone(&self.service);
            return Box::pin(async move { Ok(unary::should_rate_limit(&service, request).await) });
        }
        if under(
            path,
            <RateLimitServiceServer<RlsService> as NamedService>::NAME,
        ) {
            return self.rls.clone().call(request);
        }
        if under(
            path,
            <ReservationsServer<ReservationsService> as NamedService>::NAME,
        ) {
            return self.reservations.clone().call(request);
        }
        if under(path, <HealthServer<HealthService> as NamedService>::NAME) {
            return self.health.clone().call(request);
        }
        let unknown = tonic::Status::unimplemented(format!("no gRPC service at {path}"));
        Box::pin(std::future::ready(Ok(unknown.into_http())))
    }
}

/// Whether `path` is `/<service>/<method>`.
fn under(path: &str, service: &str) -> bool {
    path.strip_prefix('/')
        .and_then(|p| p.strip_prefix(service))
        .is_some_and(|method| method.starts_with('/'))
}

/// A connection accepted and admitted, with its place under the connection limits, which it
/// gives back when it closes.
type Admitted = (std::net::TcpStream, Slot);

/// Serves gRPC connections accepted from `listener` with `serving` on `threads`
/// single-threaded runtimes (at least one), until `stopped` turns true; then lets each finish
/// the requests in flight and returns once every runtime has stopped. A connection past
/// `--max-connections`, or past `--max-connections-per-ip` from its address, is closed as soon
/// as it is accepted.
pub(crate) async fn serve(
    listener: TcpListener,
    serving: Serving,
    threads: usize,
    mut stopped: watch::Receiver<bool>,
) {
    let mut workers = Vec::new();
    let mut senders = Vec::new();
    for i in 0..threads.max(1) {
        let (send, receive) = mpsc::unbounded_channel::<Admitted>();
        match start_worker(i, receive, serving.clone(), stopped.clone()) {
            Ok(worker) => {
                workers.push(worker);
                senders.push(send);
            }
            Err(e) => tracing::error!(error = %e, "cannot start a gRPC runtime thread"),
        }
    }
    if senders.is_empty() {
        tracing::error!("no gRPC runtime thread started; the gRPC listener serves nothing");
        return;
    }
    let mut admission = Admission::new(serving.limits);
    let mut next = 0;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|s| *s) => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!(error = %e, "gRPC accept failed");
                // Out of descriptors, say: let connections close before accepting again.
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let Some(slot) = admission.admit(peer) else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        // Registered again on the worker's runtime; still non-blocking.
        let Ok(stream) = stream.into_std() else {
            continue;
        };
        if senders[next].send((stream, slot)).is_err() {
            tracing::error!(worker = next, "a gRPC runtime thread has stopped");
        }
        next = (next + 1) % senders.len();
    }
    drop(listener);
    drop(senders);
    let _ = tokio::task::spawn_blocking(move || {
        for worker in workers {
            let _ = worker.join();
        }
    })
    .await;
}

/// A thread running one single-threaded runtime that serves the connections sent to it.
fn start_worker(
    index: usize,
    connections: mpsc::UnboundedReceiver<Admitted>,
    serving: Serving,
    stopped: watch::Receiver<bool>,
) -> io::Result<JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name(format!("sluice-grpc-{index}"))
        .spawn(move || runtime.block_on(serve_connections(connections, serving, stopped)))
}

/// Serves each connection sent to this thread until `stopped` turns true, then lets the
/// requests in flight finish.
async fn serve_connections(
    mut connections: mpsc::UnboundedReceiver<Admitted>,
    serving: Serving,
    mut stopped: watch::Receiver<bool>,
) {
    let limits = serving.limits;
    let mut h2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    // As on the HTTP listeners: at most `H2_MAX_STREAMS` streams in flight on one connection
    // (Envoy multiplexes its calls over few connections, and opens another past the limit),
    // and an h2 client that stops answering pings is dropped. With no limit, one connection
    // opening a million streams that never end held 3 GB.
    h2.timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .keep_alive_interval(limits.h2_keep_alive)
        .keep_alive_timeout(limits.h2_keep_alive);
    // Every connection's task holds a clone; stopping waits until all are dropped.
    let (open, mut all_closed) = mpsc::channel::<()>(1);
    loop {
        let next = tokio::select! {
            next = connections.recv() => next,
            _ = stopped.wait_for(|s| *s) => None,
        };
        let Some((stream, slot)) = next else { break };
        let stream = match TcpStream::from_std(stream) {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "a gRPC connection could not join its runtime");
                continue;
            }
        };
        // The header deadline counts from here, the TLS handshake included.
        let activity = Activity::new();
        // Under TLS too: the socket's writes are what a client that never reads blocks.
        let stream = SendProgress::new(stream, activity.clone());
        let (routes, seen) = (serving.routes.clone(), activity.clone());
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let in_flight = seen.begin(request.version());
            let request = request.map(|body| BodyDeadline::new(body, limits.header_read));
            let answer = routes.route(request);
            async move {
                let answer = answer.await?;
                Ok::<_, Infallible>(answer.map(|body| Tracked::new(body, in_flight)))
            }
        });
        let (h2, tls, stopped, open) = (
            h2.clone(),
            serving.tls.clone(),
            stopped.clone(),
            open.clone(),
        );
        tokio::spawn(async move {
            let _held = (slot, open);
            let ended = match tls {
                None => {
                    let stream = HeaderBlocks::new(stream, activity.clone());
                    let connection = h2.serve_connection(TokioIo::new(stream), service);
                    drive(connection, activity, limits, stopped).await
                }
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(limits.header_read, acceptor.accept(stream));
                    let stream = match handshake.await {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "gRPC TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!("gRPC TLS handshake took too long");
                            return;
                        }
                    };
                    let stream = HeaderBlocks::new(stream, activity.clone());
                    let connection = h2.serve_connection(TokioIo::new(stream), service);
                    drive(connection, activity, limits, stopped).await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, "gRPC connection ended with an error");
            }
        });
    }
    drop(open);
    let _ = all_closed.recv().await;
}
