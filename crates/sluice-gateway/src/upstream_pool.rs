//! The gateway's connections to the upstream.
//!
//! HTTP/1.1 connections are kept alive and reused, the most recently used first, so that a
//! burst reuses warm connections and the cold ones age out. A connection goes back to the pool
//! when the answer's body has been read to the end, from the body itself: no task is spawned
//! per request to watch for that, as hyper-util's pooled client does. A connection whose body
//! was not read to the end is closed. With `upstream_h2`, one h2 connection carries every
//! request, and a new one replaces it when it closes.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use crate::forward::RequestBody;

/// How long an idle connection is kept. Most servers close theirs sooner (nginx after 75 s,
/// Node after 5 s); a connection they closed is noticed and skipped.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// At most this many idle connections are kept; the busiest moment's connections are kept up to
/// it, so a burst as large again opens none.
const MAX_IDLE: usize = 1024;

/// Why a request could not be forwarded.
#[derive(Debug)]
pub(crate) enum UpstreamError {
    /// No connection could be made: refused, unreachable, or not accepted in time.
    Connect(std::io::Error),
    /// The connection failed while the request was sent or its answer read.
    Exchange(hyper::Error),
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamError::Connect(e) => write!(f, "cannot connect: {e}"),
            UpstreamError::Exchange(e) => write!(f, "{e}"),
        }
    }
}

/// An idle HTTP/1.1 connection.
struct Idle {
    sender: http1::SendRequest<RequestBody>,
    since: Instant,
}

/// The connections to one upstream.
pub(crate) struct UpstreamPool {
    /// `host:port`, for connecting.
    address: String,
    connect_timeout: Duration,
    h2: bool,
    /// Idle HTTP/1.1 connections, the oldest at the front.
    idle: Mutex<VecDeque<Idle>>,
    /// The h2 connection, when the upstream speaks h2.
    shared: tokio::sync::Mutex<Option<http2::SendRequest<RequestBody>>>,
}

impl UpstreamPool {
    /// Connections to `address` (`host:port`), not made until the first request.
    pub(crate) fn new(address: String, connect_timeout: Duration, h2: bool) -> Self {
        UpstreamPool {
            address,
            connect_timeout,
            h2,
            idle: Mutex::new(VecDeque::new()),
            shared: tokio::sync::Mutex::new(None),
        }
    }

    /// Sends `request` and returns the answer's head; its body streams from the upstream.
    /// HTTP/1.1 wants an origin-form target and a `Host` field, h2 an absolute URI.
    pub(crate) async fn send(
        self: &Arc<Self>,
        request: Request<RequestBody>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        if self.h2 {
            return self.send_h2(request).await;
        }
        let mut request = request;
        loop {
            let (mut sender, reused) = match self.checkout() {
                Some(sender) => (sender, true),
                None => (self.connect_h1().await?, false),
            };
            // A reused connection may still be finishing the exchange before; if it closed
            // meanwhile, take another.
            if let Err(e) = sender.ready().await {
                if reused {
                    continue;
                }
                return Err(UpstreamError::Exchange(e));
            }
            match sender.try_send_request(request).await {
                Ok(response) => {
                    let lease = Lease {
                        upstream: Arc::clone(self),
                        sender,
                    };
                    return Ok(response.map(|body| UpstreamBody {
                        body,
                        lease: Some(lease),
                    }));
                }
                Err(mut e) => match e.take_message() {
                    // Never written: the upstream had closed a kept-alive connection just as
                    // it was taken. Any other connection, or a new one, will do.
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(UpstreamError::Exchange(e.into_error())),
                },
            }
        }
    }

    async fn send_h2(
        &self,
        request: Request<RequestBody>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let mut sender = {
            // Held while connecting, so that the requests of a burst share the one connection
            // being made instead of each making its own.
            let mut shared = self.shared.lock().await;
            match shared.as_ref().filter(|s| !s.is_closed()) {
                Some(sender) => sender.clone(),
                None => {
                    let io = self.connect().await?;
                    let (sender, connection) = http2::Builder::new(TokioExecutor::new())
                        .handshake(io)
                        .await
                        .map_err(UpstreamError::Exchange)?;
                    tokio::spawn(async move {
                        if let Err(e) = connection.await {
                            tracing::debug!(error = %e, "upstream h2 connection ended with an error");
                        }
                    });
                    shared.insert(sender).clone()
                }
            }
        };
        sender.ready().await.map_err(UpstreamError::Exchange)?;
        let response = sender
            .send_request(request)
            .await
            .map_err(UpstreamError::Exchange)?;
        Ok(response.map(|body| UpstreamBody { body, lease: None }))
    }

    /// The most recently used idle connection that is still open and not too old.
    fn checkout(&self) -> Option<http1::SendRequest<RequestBody>> {
        let mut idle = self.lock_idle();
        while let Some(i) = idle.pop_back() {
            if !i.sender.is_closed() && i.since.elapsed() < IDLE_TIMEOUT {
                return Some(i.sender);
            }
        }
        None
    }

    /// Takes back a connection whose exchange is over.
    fn put(&self, sender: http1::SendRequest<RequestBody>) {
        if sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.lock_idle();
        while idle
            .front()
            .is_some_and(|i| now.duration_since(i.since) >= IDLE_TIMEOUT)
        {
            idle.pop_front();
        }
        if idle.len() < MAX_IDLE {
            idle.push_back(Idle { sender, since: now });
        }
    }

    async fn connect_h1(&self) -> Result<http1::SendRequest<RequestBody>, UpstreamError> {
        let io = self.connect().await?;
        let (sender, connection) = http1::handshake(io)
            .await
            .map_err(UpstreamError::Exchange)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    async fn connect(&self) -> Result<TokioIo<TcpStream>, UpstreamError> {
        let stream =
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.address))
                .await
            {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return Err(UpstreamError::Connect(e)),
                Err(_) => {
                    return Err(UpstreamError::Connect(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("not accepted within {:?}", self.connect_timeout),
                    )));
                }
            };
        // Requests and answers are small and each is written whole: don't let Nagle hold them.
        stream.set_nodelay(true).map_err(UpstreamError::Connect)?;
        Ok(TokioIo::new(stream))
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, VecDeque<Idle>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection lent to one exchange.
struct Lease {
    upstream: Arc<UpstreamPool>,
    sender: http1::SendRequest<RequestBody>,
}

/// The body of an upstream answer. Read to the end, it gives its connection back to the pool;
/// dropped before that, it closes the connection, which could not carry another exchange.
#[derive(Debug)]
pub struct UpstreamBody {
    body: Incoming,
    lease: Option<Lease>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").finish_non_exhaustive()
    }
}

impl UpstreamBody {
    fn release(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease.upstream.put(lease.sender);
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
        match &frame {
            None => self.release(),
            Some(Ok(_)) if self.body.is_end_stream() => self.release(),
            Some(Err(_)) => self.lease = None,
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // An answer without a body (a 204, a HEAD, `Content-Length: 0`) is never polled.
        if self.body.is_end_stream() {
            self.release();
        }
    }
}
