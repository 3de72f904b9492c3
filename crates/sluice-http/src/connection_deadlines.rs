//! The two deadlines a connection lives under besides its protocol's own: its first request
//! head must be complete within [`ConnectionLimits::header_read`] of connecting, and once no
//! request has been in flight for [`ConnectionLimits::idle`] it is closed.
//!
//! hyper enforces neither for every connection. Its HTTP/1.1 header timeout starts only once
//! hyper reads a request, but the listener first reads a few bytes to tell HTTP/1.1 from the h2
//! preface, with no time limit: a socket that sent nothing, or `PRI * HTTP/2.0` and no more, was
//! held for ever. Its h2 server has no header timeout at all, and its pings close only a client
//! that stops answering them: a client that answers, and never opens a stream, was held for
//! ever too. So each connection is driven by [`drive`], which watches what its service has seen
//! ([`Activity`], told by [`Activity::begin`] at each request head) and closes it:
//!
//! - at once, with nothing said, when no request head has arrived within `header_read` of
//!   connecting (TLS handshake and h2 preface included): such a client has sent no request, so
//!   no request of its can be lost;
//! - gracefully (h2 `GOAWAY`, so a client that sends a request at the same moment knows it was
//!   not served and can retry it), when nothing has been in flight for `idle`; a connection that
//!   does not finish closing within `header_read` more is dropped;
//! - gracefully, when the listener stops: at once when answers are in flight (hyper's
//!   HTTP/1.1 then answers with `Connection: close` and closes after the last) or the
//!   connection speaks h2 (`GOAWAY`, which tells the client which of its streams were not
//!   served, so none is lost unknowingly); an HTTP/1.1 connection with nothing in flight is
//!   still read for [`ConnectionLimits::drain`] first. Closed at once, a request its client had
//!   already sent (it arrived with the stop, or was still arriving) was cut off unread, and the
//!   client saw the connection end without an answer: for a `POST` that may have consumed
//!   quota, it cannot tell whether to send it again. Draining, such a request is answered as
//!   usual, with `Connection: close` (added by the listener's service, which asks
//!   [`InFlight::draining`]), and hyper closes the connection after it. A client that sends
//!   nothing within the drain is closed while idle, which every HTTP/1.1 client must expect.
//!
//! An answer is in flight from its request head until its body has been sent or dropped
//! ([`Tracked`]), so a long answer (a proxied download) never counts as idle. A later h2
//! request head is bounded too: one whose header block stays open for `header_read` closes
//! the connection at once ([`HeaderBlocks`](crate::header_blocks::HeaderBlocks) tells when a
//! block opens).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use hyper_util::server::graceful::GracefulConnection;
use tokio::sync::{Notify, watch};
use tokio::time::{Instant, sleep_until};

use crate::serve::ConnectionLimits;

/// What one connection's service has seen: whether a request head has arrived, how many
/// answers are in flight, and since when none has been. Cloned into the connection's service.
#[derive(Debug, Clone)]
pub struct Activity {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// When the connection was accepted: the header deadline counts from here.
    started: Instant,
    /// Whether any request head has arrived.
    requested: AtomicBool,
    /// Whether a request came over h2, which closes without losing any with `GOAWAY`.
    h2: AtomicBool,
    /// Whether the listener has stopped: every answer from now on is the connection's last.
    draining: AtomicBool,
    /// Answers begun and not yet sent or dropped.
    in_flight: AtomicUsize,
    /// When the last answer in flight ended, in milliseconds since `started`.
    idle_since_ms: AtomicU64,
    /// When the h2 header block being received opened, in milliseconds since `started`;
    /// [`NO_BLOCK`] when none is open.
    block_since_ms: AtomicU64,
    /// Told when a header block opens, so that the connection's deadline is looked at again.
    block_opened: Notify,
}

/// No header block open.
const NO_BLOCK: u64 = u64::MAX;

impl Activity {
    /// A connection accepted now, which has sent nothing yet.
    pub fn new() -> Self {
        Activity {
            shared: Arc::new(Shared {
                started: Instant::now(),
                requested: AtomicBool::new(false),
                h2: AtomicBool::new(false),
                draining: AtomicBool::new(false),
                in_flight: AtomicUsize::new(0),
                idle_since_ms: AtomicU64::new(0),
                block_since_ms: AtomicU64::new(NO_BLOCK),
                block_opened: Notify::new(),
            }),
        }
    }

    /// A request's head has arrived, over HTTP `version`: it is in flight until the returned
    /// guard is dropped (with the answer's body, [`Tracked`], or with the service's future if
    /// it never answers).
    pub fn begin(&self, version: http::Version) -> InFlight {
        self.shared.requested.store(true, Ordering::Relaxed);
        if version == http::Version::HTTP_2 {
            self.shared.h2.store(true, Ordering::Relaxed);
        }
        self.shared.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight {
            shared: Arc::clone(&self.shared),
        }
    }

    /// An h2 header block (a request's head) has opened, or the one open has ended.
    pub fn header_block(&self, open: bool) {
        let s = &self.shared;
        if open {
            s.block_since_ms
                .store(s.millis_since_start(), Ordering::Release);
            s.block_opened.notify_one();
        } else {
            s.block_since_ms.store(NO_BLOCK, Ordering::Release);
        }
    }

    /// When the connection should next be looked at, and whether it must close then, as of
    /// `now`: as [`next_for_requests`](Self::next_for_requests) says, or sooner when a header
    /// block has been open for `header_read`.
    fn next(&self, now: Instant, limits: &ConnectionLimits) -> Next {
        let next = self.next_for_requests(now, limits);
        let since = self.shared.block_since_ms.load(Ordering::Acquire);
        if since == NO_BLOCK {
            return next;
        }
        let deadline = self.shared.started + Duration::from_millis(since) + limits.header_read;
        match next {
            _ if now >= deadline => Next::Abandon,
            Next::At(at) => Next::At(at.min(deadline)),
            other => other,
        }
    }

    /// When the connection should next be looked at for its requests (the first head's
    /// deadline, the idle timeout), and whether it must close then, as of `now`.
    fn next_for_requests(&self, now: Instant, limits: &ConnectionLimits) -> Next {
        let s = &self.shared;
        if !s.requested.load(Ordering::Relaxed) {
            let deadline = s.started + limits.header_read;
            return if now >= deadline {
                Next::Abandon
            } else {
                // A request may come and go before the header deadline, and its idle deadline
                // be earlier still (an idle timeout shorter than the header timeout): look
                // again by then.
                Next::At(deadline.min(now + limits.idle))
            };
        }
        if s.in_flight.load(Ordering::Acquire) > 0 {
            // Once the answers end, the connection is idle for `idle` at the earliest from then.
            return Next::At(now + limits.idle);
        }
        let idle_since = s.started + Duration::from_millis(s.idle_since_ms.load(Ordering::Acquire));
        let deadline = idle_since + limits.idle;
        if now >= deadline {
            Next::Close
        } else {
            Next::At(deadline)
        }
    }
}

impl Default for Activity {
    fn default() -> Self {
        Activity::new()
    }
}

/// What to do with a connection next.
enum Next {
    /// Look again then.
    At(Instant),
    /// No request head within the header deadline (the first, or a header block open that
    /// long): drop it.
    Abandon,
    /// Idle too long: close it gracefully.
    Close,
}

/// One answer in flight; ends when dropped.
#[derive(Debug)]
pub struct InFlight {
    shared: Arc<Shared>,
}

impl InFlight {
    /// Whether the listener has stopped since the connection was accepted: an HTTP/1.1 answer
    /// should then say `Connection: close`, since the connection closes after it.
    pub fn draining(&self) -> bool {
        self.shared.draining.load(Ordering::Relaxed)
    }
}

impl Shared {
    fn millis_since_start(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(NO_BLOCK - 1)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let s = &self.shared;
        let since = s.millis_since_start();
        // Written before the count falls, so whoever sees it at zero sees this time too.
        s.idle_since_ms.fetch_max(since, Ordering::AcqRel);
        s.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

pin_project_lite::pin_project! {
    /// An answer's body, which keeps its answer in flight until it has been sent or dropped.
    #[derive(Debug)]
    pub struct Tracked<B> {
        #[pin]
        body: B,
        in_flight: InFlight,
    }
}

impl<B> Tracked<B> {
    /// `body`, holding `in_flight` for as long as it lives.
    pub fn new(body: B, in_flight: InFlight) -> Self {
        Tracked { body, in_flight }
    }
}

impl<B: Body> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Serves `connection` to its end under the deadlines of `limits`, as `activity` (given to its
/// service) tells what it has seen; closes it gracefully once `stopped` turns true (after the
/// drain, for an HTTP/1.1 connection with nothing in flight), and then waits for the requests
/// in flight (the caller bounds how long). Returns how it ended; a connection dropped at a
/// deadline ended without error.
pub fn drive<C>(
    connection: C,
    activity: Activity,
    limits: ConnectionLimits,
    stopped: watch::Receiver<bool>,
) -> impl Future<Output = Result<(), C::Error>> + Send
where
    C: GracefulConnection + Send,
    C::Error: Send,
{
    // Declared `Send` here, where it is proven once for every connection type: proven at each
    // spawn instead, the compiler cannot see that the borrows inside are `Send` for every
    // lifetime.
    driving(connection, activity, limits, stopped)
}

async fn driving<C>(
    connection: C,
    activity: Activity,
    limits: ConnectionLimits,
    mut stopped: watch::Receiver<bool>,
) -> Result<(), C::Error>
where
    C: GracefulConnection,
{
    let mut connection = std::pin::pin!(connection);
    // Once closing: until when it may take (`None` when the listener stops, which the caller
    // bounds).
    let mut closing: Option<Option<Instant>> = None;
    // Once the listener has stopped and the connection is still read: until when.
    let mut draining: Option<Instant> = None;
    loop {
        let wake = match closing {
            None if draining.is_some_and(|until| Instant::now() >= until) => {
                connection.as_mut().graceful_shutdown();
                closing = Some(None);
                None
            }
            None => match activity.next(Instant::now(), &limits) {
                Next::At(at) => Some(draining.map_or(at, |until| at.min(until))),
                Next::Abandon => {
                    tracing::debug!(
                        timeout = ?limits.header_read,
                        "connection closed: no request head within the header timeout"
                    );
                    return Ok(());
                }
                Next::Close => {
                    tracing::debug!(idle = ?limits.idle, "idle connection closed");
                    connection.as_mut().graceful_shutdown();
                    let until = Instant::now() + limits.header_read;
                    closing = Some(Some(until));
                    Some(until)
                }
            },
            Some(until) => until,
        };
        tokio::select! {
            // The connection first: what its client sent before the stop is read before the
            // stop is looked at.
            biased;
            ended = connection.as_mut() => return ended,
            // A header block opened: its deadline may be the nearest.
            () = activity.shared.block_opened.notified(), if closing.is_none() => {}
            _ = stopped.wait_for(|s| *s), if closing.is_none() && draining.is_none() => {
                let s = &activity.shared;
                s.draining.store(true, Ordering::Relaxed);
                let h2 = s.h2.load(Ordering::Relaxed);
                if h2 || s.in_flight.load(Ordering::Acquire) > 0 {
                    connection.as_mut().graceful_shutdown();
                    closing = Some(None);
                } else {
                    draining = Some(Instant::now() + limits.drain);
                }
            }
            () = sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {
                if matches!(closing, Some(Some(until)) if Instant::now() >= until) {
                    tracing::debug!("connection dropped: it did not finish closing in time");
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::lifecycle::Lifecycle;

    async fn serving(limits: ConnectionLimits) -> (Lifecycle, SocketAddr) {
        let mut service = Lifecycle::new(limits);
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "up" }));
        let addr = service
            .listen(SocketAddr::from(([127, 0, 0, 1], 0)), app)
            .await
            .unwrap();
        (service, addr)
    }

    /// How long until the server closes `socket`, reading (and discarding) what it sends; at
    /// most an hour of the test's clock.
    async fn closed_after(mut socket: TcpStream) -> Duration {
        let started = Instant::now();
        let mut sink = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(3600), socket.read_to_end(&mut sink));
        assert!(read.await.is_ok(), "still open after an hour");
        started.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_sends_no_request_head_is_closed_at_the_header_timeout() {
        let limits = ConnectionLimits {
            header_read: Duration::from_secs(10),
            ..ConnectionLimits::default()
        };
        let (service, addr) = serving(limits).await;
        for sent in [&b""[..], b"PRI * HTTP/2.0", b"GET / HTTP/1.1\r\nHost:"] {
            let mut socket = TcpStream::connect(addr).await.unwrap();
            socket.write_all(sent).await.unwrap();
            let held = closed_after(socket).await;
            assert!(
                (Duration::from_secs(10)..Duration::from_secs(11)).contains(&held),
                "{:?} held {held:?}",
                String::from_utf8_lossy(sent)
            );
        }
        service.shutdown().await;
    }

    /// On stopping, an HTTP/1.1 connection with nothing in flight is still read for the drain,
    /// then closed; one with no request yet, too.
    #[tokio::test(start_paused = true)]
    async fn stopping_closes_an_idle_connection_at_the_end_of_the_drain() {
        let limits = ConnectionLimits {
            header_read: Duration::from_secs(3600),
            drain: Duration::from_secs(5),
            ..ConnectionLimits::default()
        };
        let (service, addr) = serving(limits).await;
        let mut kept_alive = TcpStream::connect(addr).await.unwrap();
        kept_alive
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = [0; 12];
        kept_alive.read_exact(&mut answer).await.unwrap();
        let silent = TcpStream::connect(addr).await.unwrap();
        let stopped_at = Instant::now();
        let stopping = tokio::spawn(service.shutdown());
        for socket in [kept_alive, silent] {
            closed_after(socket).await;
            let held = stopped_at.elapsed();
            assert!(
                (Duration::from_secs(5)..Duration::from_secs(6)).contains(&held),
                "held {held:?} after the stop"
            );
        }
        stopping.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_with_nothing_in_flight_is_closed_at_the_idle_timeout() {
        let limits = ConnectionLimits {
            header_read: Duration::from_secs(3600),
            idle: Duration::from_secs(60),
            ..ConnectionLimits::default()
        };
        let (service, addr) = serving(limits).await;
        let mut socket = TcpStream::connect(addr).await.unwrap();
        socket
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = [0; 12];
        socket.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"HTTP/1.1 200");
        let held = closed_after(socket).await;
        assert!(
            (Duration::from_secs(60)..Duration::from_secs(61)).contains(&held),
            "held {held:?}"
        );
        service.shutdown().await;
    }
}
