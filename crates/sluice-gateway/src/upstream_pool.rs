//! The gateway's connections to the upstream.
//!
//! HTTP/1.1 connections are kept alive and reused, the most recently used first, so that a
//! burst reuses warm connections and the cold ones age out. A connection belongs to the request
//! that took it until the answer's body has been read to the end, and goes back to the pool from
//! the body itself: no task is spawned per request or per connection. A connection whose body
//! was not read to the end, or whose answer said `Connection: close`, is closed.
//!
//! Two clients share this: the gateway's own HTTP/1.1 client ([`H1Connection`]), which writes
//! the request and reads the answer on the request's task, carries every request whose body is
//! whole or short (none, the bytes read for a reservation's estimate, or a `Content-Length` of at
//! most 64 KiB, read first); hyper's carries the rest — a longer or chunked body that streams
//! from the client, `Expect: 100-continue`, `CONNECT` — and h2. With
//! `upstream_h2`, one h2 connection carries every request, and a new one replaces it when it
//! closes.
//!
//! **Sending again.** An idle connection the upstream closed is usually seen before it is
//! taken (the runtime has its end), and skipped. When the close crosses the request, the
//! request is sent once more, on a new connection, only when the upstream cannot have acted on
//! it: the connection was reused (a new one that fails is the upstream's failure), and either
//! the first write failed with nothing accepted, or the request's method is idempotent (RFC 9110
//! §9.2.2: GET, HEAD, OPTIONS, TRACE, PUT, DELETE) and the connection ended before any byte of
//! an answer. A POST whose connection ends unanswered gets `502`: the upstream may have done it.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future;
use http::header::EXPECT;
use http::{Method, Request, Response, request};
use http_body::Body;
use http_body_util::{BodyExt, Either};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_http::RequestBody as ClientBody;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::answer_framing::Decoder;
use crate::forward::RequestBody;
use crate::h1_connection::{AnswerHead, H1Connection};
use crate::upstream_body::{Lease, UpstreamBody};

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
    Exchange(std::io::Error),
    /// The answer's head did not come by the deadline.
    TimedOut,
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamError::Connect(e) => write!(f, "cannot connect: {e}"),
            UpstreamError::Exchange(e) => write!(f, "{e}"),
            UpstreamError::TimedOut => write!(f, "no answer in time"),
        }
    }
}

/// An idle connection and since when.
struct Idle<C> {
    connection: C,
    since: Instant,
}

/// Idle connections, the oldest at the front.
struct IdleList<C>(Mutex<VecDeque<Idle<C>>>);

impl<C> IdleList<C> {
    fn new() -> Self {
        IdleList(Mutex::new(VecDeque::new()))
    }

    /// The most recently used idle connection that `usable` accepts and is not too old.
    fn take(&self, usable: impl Fn(&C) -> bool) -> Option<C> {
        let mut idle = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(i) = idle.pop_back() {
            if i.since.elapsed() < IDLE_TIMEOUT && usable(&i.connection) {
                return Some(i.connection);
            }
        }
        None
    }

    /// Keeps `connection`, dropping those idle too long, up to [`MAX_IDLE`].
    fn put(&self, connection: C) {
        let now = Instant::now();
        let mut idle = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        while idle
            .front()
            .is_some_and(|i| now.duration_since(i.since) >= IDLE_TIMEOUT)
        {
            idle.pop_front();
        }
        if idle.len() < MAX_IDLE {
            idle.push_back(Idle {
                connection,
                since: now,
            });
        }
    }
}

/// The connections to one upstream.
pub(crate) struct UpstreamPool {
    /// `host:port`, for connecting.
    address: String,
    connect_timeout: Duration,
    h2: bool,
    /// Idle connections of the gateway's own HTTP/1.1 client.
    h1: IdleList<H1Connection>,
    /// Idle HTTP/1.1 connections of hyper's client.
    hyper: IdleList<http1::SendRequest<RequestBody>>,
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
            h1: IdleList::new(),
            hyper: IdleList::new(),
            shared: tokio::sync::Mutex::new(None),
        }
    }

    /// Sends `request` and returns the answer's head, which must come within `timeout`; its
    /// body streams from the upstream. HTTP/1.1 wants an origin-form target and a `Host`
    /// field, h2 an absolute URI.
    ///
    /// Not an `async fn`: an `async fn`'s future keeps its arguments for its whole life, beside
    /// whatever it moves them into, so the request (264 bytes) would sit in it next to its own
    /// parts. Here it is taken apart before the future exists. Only the common case, a whole
    /// body on the gateway's own client, is a future of its own, awaited in place by the
    /// caller; the others are boxed, so that the future every request moves into its box is
    /// as small as that case needs and not as large as hyper's or h2's handshakes.
    pub(crate) fn send(
        self: &Arc<Self>,
        request: Request<RequestBody>,
        timeout: Duration,
    ) -> impl Future<Output = Result<Response<UpstreamBody>, UpstreamError>> + Send + 'static {
        let deadline = Instant::now() + timeout;
        let pool = Arc::clone(self);
        if self.h2 {
            return future::Either::Right(Box::pin(async move {
                within(deadline, pool.send_h2(request)).await
            }) as Sending);
        }
        let (parts, body) = request.into_parts();
        match carried(&parts, body) {
            Carried::Whole(body) => future::Either::Left(pool.send_h1(parts, body, deadline)),
            Carried::Short(body) => future::Either::Right(Box::pin(async move {
                pool.send_short(parts, body, deadline).await
            }) as Sending),
            Carried::Hyper(body) => future::Either::Right(Box::pin(async move {
                within(deadline, pool.send_hyper(Request::from_parts(parts, body))).await
            }) as Sending),
        }
    }

    /// Reads a short body whole, then sends the request on the gateway's own client.
    async fn send_short(
        self: &Arc<Self>,
        parts: request::Parts,
        body: ClientBody,
        deadline: Instant,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        // A client that fails to send the body it announced leaves nothing to forward.
        let read = async {
            body.collect()
                .await
                .map(|b| b.to_bytes())
                .map_err(|e| UpstreamError::Exchange(std::io::Error::other(e)))
        };
        let body = within(deadline, read).await?;
        self.send_h1_in_place(&parts, Some(body), deadline).await
    }

    /// Sends a request whose body is whole on the gateway's own client, once more on a new
    /// connection when a reused one ended before the upstream can have acted on it (see the
    /// module's doc).
    ///
    /// An `async` block rather than an `async fn`, for the reason [`send`](Self::send) gives:
    /// the block keeps `parts` once, where an `async fn` would keep a second copy.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn would keep a second copy of `parts`"
    )]
    fn send_h1(
        self: Arc<Self>,
        parts: request::Parts,
        body: Option<Bytes>,
        deadline: Instant,
    ) -> impl Future<Output = Result<Response<UpstreamBody>, UpstreamError>> + Send + 'static {
        async move { self.send_h1_in_place(&parts, body, deadline).await }
    }

    async fn send_h1_in_place(
        self: &Arc<Self>,
        parts: &request::Parts,
        body: Option<Bytes>,
        deadline: Instant,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let (mut connection, reused) = match self.h1.take(|c| !c.is_stale()) {
            Some(connection) => (connection, true),
            // A new connection is the rare case: its connect and timer wait boxed.
            None => (Box::pin(self.connect_h1(deadline)).await?, false),
        };
        let head = match connection.exchange(parts, body.as_ref(), deadline).await {
            Ok(head) => head,
            Err(e) if e.timed_out => return Err(UpstreamError::TimedOut),
            Err(e) if reused && (e.unsent || (e.unanswered && parts.method.is_idempotent())) => {
                tracing::debug!(error = %e.error, "a kept-alive upstream connection had closed; sending again");
                connection = Box::pin(self.connect_h1(deadline)).await?;
                match connection.exchange(parts, body.as_ref(), deadline).await {
                    Ok(head) => head,
                    Err(e) if e.timed_out => return Err(UpstreamError::TimedOut),
                    Err(e) => return Err(UpstreamError::Exchange(e.error)),
                }
            }
            Err(e) => return Err(UpstreamError::Exchange(e.error)),
        };
        Ok(self.answer(connection, head))
    }

    /// A new connection for the gateway's own client, made by `deadline`.
    async fn connect_h1(&self, deadline: Instant) -> Result<H1Connection, UpstreamError> {
        let stream = within(deadline, self.connect()).await?;
        Ok(H1Connection::new(stream, deadline))
    }

    /// The answer on `connection`: a body read whole with the head frees the connection at
    /// once; any other is read as the client takes it.
    fn answer(
        self: &Arc<Self>,
        mut connection: H1Connection,
        head: AnswerHead,
    ) -> Response<UpstreamBody> {
        let decoder = Decoder::new(head.framing);
        let body = match decoder.remaining() {
            Some(n) if connection.buf.len() as u64 >= n => {
                let bytes = connection.buf.split_to(n as usize).freeze();
                if head.keep_alive && connection.buf.is_empty() {
                    self.put_h1(connection);
                }
                UpstreamBody::whole(bytes)
            }
            _ => UpstreamBody::streamed(connection, decoder, head.keep_alive, Arc::clone(self)),
        };
        let mut response = Response::new(body);
        *response.status_mut() = head.status;
        *response.version_mut() = head.version;
        *response.headers_mut() = head.headers;
        response
    }

    /// Sends a request on hyper's HTTP/1.1 client: one whose body streams from the client.
    async fn send_hyper(
        self: &Arc<Self>,
        mut request: Request<RequestBody>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        loop {
            let (mut sender, reused) = match self.hyper.take(|s| !s.is_closed()) {
                Some(sender) => (sender, true),
                None => (self.connect_hyper().await?, false),
            };
            // A reused connection may still be finishing the exchange before; if it closed
            // meanwhile, take another.
            if let Err(e) = sender.ready().await {
                if reused {
                    continue;
                }
                return Err(exchange(e));
            }
            match sender.try_send_request(request).await {
                Ok(response) => {
                    let lease = Lease {
                        upstream: Arc::clone(self),
                        sender,
                    };
                    return Ok(response.map(|body| UpstreamBody::hyper(body, Some(lease))));
                }
                Err(mut e) => match e.take_message() {
                    // Never written: the upstream had closed a kept-alive connection just as
                    // it was taken. Any other connection, or a new one, will do.
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(exchange(e.into_error())),
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
                    let io = TokioIo::new(self.connect().await?);
                    let (sender, connection) = http2::Builder::new(TokioExecutor::new())
                        .handshake(io)
                        .await
                        .map_err(exchange)?;
                    tokio::spawn(async move {
                        if let Err(e) = connection.await {
                            tracing::debug!(error = %e, "upstream h2 connection ended with an error");
                        }
                    });
                    shared.insert(sender).clone()
                }
            }
        };
        sender.ready().await.map_err(exchange)?;
        let response = sender.send_request(request).await.map_err(exchange)?;
        Ok(response.map(|body| UpstreamBody::hyper(body, None)))
    }

    /// Takes back a connection of the gateway's own client whose exchange is over.
    pub(crate) fn put_h1(&self, connection: H1Connection) {
        self.h1.put(connection);
    }

    /// Takes back a hyper connection whose exchange is over.
    pub(crate) fn put_hyper(&self, sender: http1::SendRequest<RequestBody>) {
        if !sender.is_closed() {
            self.hyper.put(sender);
        }
    }

    async fn connect_hyper(&self) -> Result<http1::SendRequest<RequestBody>, UpstreamError> {
        let io = TokioIo::new(self.connect().await?);
        let (sender, connection) = http1::handshake(io).await.map_err(exchange)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    async fn connect(&self) -> Result<TcpStream, UpstreamError> {
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
        Ok(stream)
    }
}

/// A request being sent on a path other than the common one, on the heap.
type Sending = Pin<Box<dyn Future<Output = Result<Response<UpstreamBody>, UpstreamError>> + Send>>;

/// `work`, or [`UpstreamError::TimedOut`] if it has not finished by `deadline`.
async fn within<T>(
    deadline: Instant,
    work: impl Future<Output = Result<T, UpstreamError>>,
) -> Result<T, UpstreamError> {
    tokio::time::timeout_at(deadline, work)
        .await
        .unwrap_or(Err(UpstreamError::TimedOut))
}

fn exchange(e: hyper::Error) -> UpstreamError {
    UpstreamError::Exchange(std::io::Error::other(e))
}

/// The largest request body, framed by `Content-Length`, that is read whole before it is
/// forwarded, so that the request goes on the gateway's own client: an API's JSON body, not an
/// upload. nginx buffers every request body by default (`proxy_request_buffering on`).
const MAX_WHOLE_BODY: u64 = 64 * 1024;

/// Who carries a request, by its body.
enum Carried {
    /// The gateway's own client, with no body (`None`) or this whole one.
    Whole(Option<Bytes>),
    /// The gateway's own client, once this short body has been read.
    Short(ClientBody),
    /// hyper's client.
    Hyper(RequestBody),
}

/// Who carries the request. The gateway's own client: a request without a body, one whose
/// bytes were read to find a reservation's estimate, or one with a `Content-Length` of at most
/// [`MAX_WHOLE_BODY`]. hyper's: a body that streams from the client (written while the answer
/// may already come), or a request that waits on an interim answer (`Expect: 100-continue`)
/// or turns into a tunnel (`CONNECT`).
fn carried(parts: &request::Parts, body: RequestBody) -> Carried {
    if parts.method == Method::CONNECT {
        return Carried::Hyper(body);
    }
    match body {
        // Read with its head by the listener: nothing to wait for. Its body is here, so an
        // `Expect: 100-continue` asks nothing of the gateway (the upstream's interim answer is
        // passed over), and the common case is spared looking for the field.
        Either::Left(client) if client.as_whole().is_some() => {
            Carried::Whole(client.as_whole().cloned())
        }
        body if parts.headers.contains_key(EXPECT) => Carried::Hyper(body),
        Either::Left(incoming) if incoming.is_end_stream() => Carried::Whole(None),
        Either::Left(incoming)
            if incoming
                .size_hint()
                .exact()
                .is_some_and(|n| n <= MAX_WHOLE_BODY) =>
        {
            Carried::Short(incoming)
        }
        Either::Right(mut whole) => {
            // `Full` has its one frame ready.
            let mut cx = Context::from_waker(Waker::noop());
            Carried::Whole(Some(match Pin::new(&mut whole).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
                _ => Bytes::new(),
            }))
        }
        streamed => Carried::Hyper(streamed),
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::Full;

    use super::*;

    fn parts(method: Method, expect: bool) -> request::Parts {
        let mut builder = http::Request::builder().method(method).uri("/a");
        if expect {
            builder = builder.header(EXPECT, "100-continue");
        }
        builder.body(()).unwrap().into_parts().0
    }

    /// A body the listener read whole goes on the gateway's own client, `Expect` or not; one
    /// still to come goes to hyper when the client waits for leave to send it, as does CONNECT.
    #[test]
    fn a_whole_body_is_sent_whole_and_a_waiting_one_goes_to_hyper() {
        let whole = || Either::Left(sluice_http::RequestBody::whole(Bytes::from_static(b"{}")));
        for expect in [false, true] {
            let Carried::Whole(Some(body)) = carried(&parts(Method::POST, expect), whole()) else {
                panic!("a whole body with expect={expect} was not sent whole");
            };
            assert_eq!(&body[..], b"{}");
        }
        assert!(matches!(
            carried(&parts(Method::CONNECT, false), whole()),
            Carried::Hyper(_)
        ));
        let read = || Either::Right(Full::new(Bytes::from_static(b"[1]")));
        assert!(matches!(
            carried(&parts(Method::POST, true), read()),
            Carried::Hyper(_)
        ));
        let Carried::Whole(Some(body)) = carried(&parts(Method::POST, false), read()) else {
            panic!("bytes read for an estimate were not sent whole");
        };
        assert_eq!(&body[..], b"[1]");
    }
}
