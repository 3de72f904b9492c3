//! Serving connections with the limits a public listener needs: a client must send its request
//! head within a time (a slowloris holding connections open by trickling headers is closed), an
//! h2 client that stops answering pings is dropped, and stopping lets the requests in flight
//! finish. The service, the gateway and the gateway's admin listener all serve through here.

use std::convert::Infallible;
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower_service::Service;

use crate::PeerAddr;

/// How long a connection may take, and stay idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionTimeouts {
    /// From the connection's start, or the end of the previous answer on a kept-alive one, until
    /// the next request's head is complete. A connection that takes longer is closed.
    pub header_read: Duration,
    /// How often an idle h2 connection is pinged; one that does not answer within as long again
    /// is closed.
    pub h2_keep_alive: Duration,
}

impl Default for ConnectionTimeouts {
    /// 10 s for a request head (nginx's `client_header_timeout` is 60 s; a rate limiter's clients
    /// send small heads), a ping every 30 s.
    fn default() -> Self {
        ConnectionTimeouts {
            header_read: Duration::from_secs(10),
            h2_keep_alive: Duration::from_secs(30),
        }
    }
}

/// Accepts connections on `listener` until `stopped` turns true, serving each with `service`
/// (HTTP/1.1 and h2), then lets the requests in flight finish. Each request carries the peer's
/// address as [`PeerAddr`] (and as axum's `ConnectInfo`).
pub async fn serve_connections<S, B>(
    listener: TcpListener,
    service: S,
    mut stopped: watch::Receiver<bool>,
    timeouts: ConnectionTimeouts,
) where
    S: Service<Request<Incoming>, Response = http::Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(timeouts.h2_keep_alive)
        .keep_alive_timeout(timeouts.h2_keep_alive);
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let service = service.clone();
                // Every request carries the peer's address.
                let with_peer = hyper::service::service_fn(move |mut request: Request<Incoming>| {
                    request.extensions_mut().insert(PeerAddr(peer));
                    #[cfg(feature = "axum")]
                    request
                        .extensions_mut()
                        .insert(axum::extract::ConnectInfo(peer));
                    let mut service = service.clone();
                    async move {
                        std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
                        service.call(request).await
                    }
                });
                let connection = builder
                    .serve_connection(TokioIo::new(stream), with_peer)
                    .into_owned();
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                });
            }
            _ = stopped.wait_for(|s| *s) => break,
        }
    }
    drop(listener);
    graceful.shutdown().await;
}
