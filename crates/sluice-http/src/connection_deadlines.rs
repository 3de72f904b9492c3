//! The three deadlines a connection lives under besides its protocol's own: its first request
//! head must be complete within [`ConnectionLimits::header_read`] of connecting (and an
//! HTTP/1.1 connection's next one within as long of its last answer), once no request has been
//! in flight for [`ConnectionLimits::idle`] it is closed, and so it is once what it has to send
//! has made no progress for [`ConnectionLimits::send`].
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
//! - gracefully too, when an HTTP/1.1 connection's next request head has not come within
//!   `header_read` of its last answer (nothing sent, or a head begun and not finished: a
//!   slowloris after a first request); hyper closes such a connection at once, unanswered. This
//!   is the bound hyper's own HTTP/1.1 header timer kept, which the listeners no longer set:
//!   that timer was armed and cancelled around every request, here the bound costs nothing
//!   per request;
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
//! - at once, with nothing more said, when what it has to send has made no progress for
//!   `send`: its socket has taken no byte for that long ([`SendProgress`] tells when a write
//!   blocks), or an answer's body waits that long to be asked for its next part (hyper asks
//!   only once the last part is on its way: an h2 client that grants no flow-control window
//!   stalls it without filling any buffer, and hyper holds the part it has until the window
//!   opens). Such a client reads nothing, so nothing said to it
//!   could arrive; without this deadline a client that never read held its connection, and the
//!   answers not yet written, for as long as it stayed.
//!
//! An answer is in flight from its request head until its body has been sent or dropped
//! ([`Tracked`]), so a long answer (a proxied download) never counts as idle; one whose body
//! is slow to produce its parts (an upstream that is slow to send) never counts as stalled,
//! since only a part produced and not yet asked for waits on the client. A later h2
//! request head is bounded too: one whose header block stays open for `header_read` closes
//! the connection at once ([`HeaderBlocks`](crate::header_blocks::HeaderBlocks) tells when a
//! block opens).
//!
//! [`SendProgress`]: crate::send_progress::SendProgress

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
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
    /// Told when a header block opens or the socket's writes block, so that the connection's
    /// deadlines are looked at again.
    changed: Notify,
    /// Whether the socket's last write returned `Pending` ([`SendProgress`]).
    ///
    /// [`SendProgress`]: crate::send_progress::SendProgress
    send_blocked: AtomicBool,
    /// Answers whose body has produced a part that has not been taken further: their next part
    /// waits for the connection to ask for it.
    answers_waiting: AtomicUsize,
    /// When output last made progress (the socket's writes blocked or unblocked, an answer's
    /// body produced a part), in milliseconds since `started`: a stall counts from here.
    output_progress_ms: AtomicU64,
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
                changed: Notify::new(),
                send_blocked: AtomicBool::new(false),
                answers_waiting: AtomicUsize::new(0),
                output_progress_ms: AtomicU64::new(0),
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
            waiting: false,
        }
    }

    /// The socket's writes have blocked (`true`: a write returned `Pending`) or moved again.
    /// Told only when it changes ([`SendProgress`](crate::send_progress::SendProgress)).
    pub fn send_blocked(&self, blocked: bool) {
        let s = &self.shared;
        s.output_progress_ms
            .store(s.millis_since_start(), Ordering::Release);
        s.send_blocked.store(blocked, Ordering::Release);
        if blocked {
            s.changed.notify_one();
        }
    }

    /// An h2 header block (a request's head) has opened, or the one open has ended.
    pub fn header_block(&self, open: bool) {
        let s = &self.shared;
        if open {
            s.block_since_ms
                .store(s.millis_since_start(), Ordering::Release);
            s.changed.notify_one();
        } else {
            s.block_since_ms.store(NO_BLOCK, Ordering::Release);
        }
    }

    /// When the connection should next be looked at, and whether it must close then, as of
    /// `now`: as [`next_for_requests`](Self::next_for_requests) says, or sooner when a header
    /// block has been open for `header_read` or output has stalled for `send`.
    fn next(&self, now: Instant, limits: &ConnectionLimits) -> Next {
        match self.next_for_output(now, limits) {
            Next::At(at) => match self.next_for_head(now, limits) {
                Next::At(other) => Next::At(at.min(other)),
                other => other,
            },
            stalled => stalled,
        }
    }

    /// As [`next_for_requests`](Self::next_for_requests), or sooner when a header block has
    /// been open for `header_read`.
    fn next_for_head(&self, now: Instant, limits: &ConnectionLimits) -> Next {
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

    /// When the connection's output should next be looked at, or [`Next::Stalled`] when it has
    /// made no progress for `send`. A socket whose writes block says so at once (the activity
    /// is told); an answer waiting to be asked for its body's next part does not, since that
    /// happens on every answer, between two parts: the output is looked at every `send`, and a
    /// stall that began since is then seen with its start, so it is cut exactly `send` after.
    fn next_for_output(&self, now: Instant, limits: &ConnectionLimits) -> Next {
        let s = &self.shared;
        let stalled =
            s.send_blocked.load(Ordering::Acquire) || s.answers_waiting.load(Ordering::Acquire) > 0;
        if stalled {
            let since = Duration::from_millis(s.output_progress_ms.load(Ordering::Acquire));
            let deadline = s.started + since + limits.send;
            if now >= deadline {
                return Next::Stalled;
            }
            return Next::At(deadline);
        }
        // Not stalled now, but a request may come and stall at any moment without telling:
        // look again within a send timeout (one timer a connection, however busy).
        Next::At(now + limits.send)
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
        let (wait, late) = Self::between_requests(s.h2.load(Ordering::Relaxed), limits);
        if s.in_flight.load(Ordering::Acquire) > 0 {
            // Once the answers end, the connection may wait `wait` at the most from then.
            return Next::At(now + wait);
        }
        let idle_since = s.started + Duration::from_millis(s.idle_since_ms.load(Ordering::Acquire));
        let deadline = idle_since + wait;
        if now >= deadline {
            late
        } else {
            Next::At(deadline)
        }
    }

    /// How long a connection that has been served may go with nothing in flight, and what
    /// ends it then. An h2 connection waits the idle timeout (a later request's header block
    /// is bounded on its own, [`next_for_head`](Self::next_for_head)); an HTTP/1.1 one must
    /// also send its next request head within `header_read` of the previous answer. hyper's
    /// own header timer would bound that head, but it is set and cancelled around every
    /// request (a boxed sleep and two turns of the timer wheel, about 1,450 instructions per
    /// `/json` answer), where this bound costs nothing per request: the connection is looked
    /// at again at the latest `header_read` after any answer may have ended.
    fn between_requests(h2: bool, limits: &ConnectionLimits) -> (Duration, Next) {
        if h2 || limits.idle <= limits.header_read {
            (limits.idle, Next::Close)
        } else {
            (limits.header_read, Next::HeadOverdue)
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
    /// An HTTP/1.1 connection whose next request head has not come within the header deadline
    /// of its last answer: close it gracefully (hyper closes at once when no request is in
    /// flight, a head begun and not finished included).
    HeadOverdue,
    /// What it has to send made no progress for the send timeout: drop it.
    Stalled,
}

/// One answer in flight; ends when dropped.
#[derive(Debug)]
pub struct InFlight {
    shared: Arc<Shared>,
    /// Whether its body has produced a part not yet taken further (counted in the
    /// connection's `answers_waiting`).
    waiting: bool,
}

impl InFlight {
    /// Whether the listener has stopped since the connection was accepted: an HTTP/1.1 answer
    /// should then say `Connection: close`, since the connection closes after it.
    pub fn draining(&self) -> bool {
        self.shared.draining.load(Ordering::Relaxed)
    }

    /// The answer's body is asked for its next part: the last one has been taken.
    fn asked(&mut self) {
        if self.waiting {
            self.waiting = false;
            self.shared.answers_waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The answer (its head, or a part of its body) has been produced: until its body is asked
    /// for the next part, it waits on the connection.
    fn produced(&mut self) {
        let s = &self.shared;
        s.output_progress_ms
            .store(s.millis_since_start(), Ordering::Release);
        if !self.waiting {
            self.waiting = true;
            s.answers_waiting.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Shared {
    fn millis_since_start(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(NO_BLOCK - 1)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.asked();
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
    /// `body`, holding `in_flight` for as long as it lives. It waits on the connection from
    /// now until first asked for a part, so that an answer whose body is never asked for at
    /// all (its connection's writes stuck behind an earlier answer, or an h2 stream waiting
    /// for window before its first part) counts as stalled too.
    pub fn new(body: B, mut in_flight: InFlight) -> Self {
        in_flight.produced();
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
        let this = self.project();
        this.in_flight.asked();
        let frame = this.body.poll_frame(cx);
        if matches!(frame, Poll::Ready(Some(Ok(_)))) {
            this.in_flight.produced();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A connection that can be asked to close once what it is doing is done: hyper's, and
/// [`h1_server`](crate::h1_server)'s.
pub trait Graceful: Future {
    /// Starts closing: a connection waiting for a request ends, one answering ends after its
    /// answers (HTTP/1.1 `Connection: close`, h2 `GOAWAY`).
    fn close_gracefully(self: Pin<&mut Self>);
}

impl<C: GracefulConnection> Graceful for C {
    fn close_gracefully(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// Serves `connection` to its end under the deadlines of `limits`, as `activity` (given to its
/// service) tells what it has seen; closes it gracefully once `stopped` turns true (after the
/// drain, for an HTTP/1.1 connection with nothing in flight), and then waits for the requests
/// in flight (the caller bounds how long). Returns how it ended; a connection dropped at a
/// deadline ended without error.
pub fn drive<C, E>(
    connection: C,
    activity: Activity,
    limits: ConnectionLimits,
    stopped: watch::Receiver<bool>,
) -> impl Future<Output = Result<(), E>> + Send
where
    C: Graceful<Output = Result<(), E>> + Send,
    E: Send,
{
    // Declared `Send` here, where it is proven once for every connection type: proven at each
    // spawn instead, the compiler cannot see that the borrows inside are `Send` for every
    // lifetime.
    driving(connection, activity, limits, stopped)
}

async fn driving<C, E>(
    connection: C,
    activity: Activity,
    limits: ConnectionLimits,
    mut stopped: watch::Receiver<bool>,
) -> Result<(), E>
where
    C: Graceful<Output = Result<(), E>>,
{
    let mut connection = std::pin::pin!(connection);
    let shared = &activity.shared;
    // The loop's own futures, kept from one wake to the next and polled only once one of them
    // has woken the task ([`SideWake`]).
    let side = Arc::new(SideWake::default());
    let side_waker = Waker::from(Arc::clone(&side));
    let mut task_waker: Option<Waker> = None;
    // A header block opened, or the socket's writes blocked: its deadline may be the nearest.
    let mut changed = std::pin::pin!(shared.changed.notified());
    let mut stop = std::pin::pin!(async move {
        let _ = stopped.wait_for(|s| *s).await;
    });
    let mut timer = std::pin::pin!(sleep_until(Instant::now()));
    // What `timer` is set to; `None` until it is set, and once it has fired.
    let mut timer_at: Option<Instant> = None;
    // Once closing: until when it may take (`None` when the listener stops, which the caller
    // bounds).
    let mut closing: Option<Option<Instant>> = None;
    // Once the listener has stopped and the connection is still read: until when.
    let mut draining: Option<Instant> = None;
    loop {
        let wake = match closing {
            None if draining.is_some_and(|until| Instant::now() >= until) => {
                connection.as_mut().close_gracefully();
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
                Next::Stalled => {
                    tracing::debug!(
                        timeout = ?limits.send,
                        "connection closed: what it had to send made no progress within the send timeout"
                    );
                    return Ok(());
                }
                next @ (Next::Close | Next::HeadOverdue) => {
                    if matches!(next, Next::Close) {
                        tracing::debug!(idle = ?limits.idle, "idle connection closed");
                    } else {
                        tracing::debug!(
                            timeout = ?limits.header_read,
                            "connection closed: no request head within the header timeout of the last answer"
                        );
                    }
                    connection.as_mut().close_gracefully();
                    let until = Instant::now() + limits.header_read;
                    closing = Some(Some(until));
                    Some(until)
                }
            },
            Some(until) => until,
        };
        if let Some(at) = wake.filter(|at| timer_at != Some(*at)) {
            timer.as_mut().reset(at);
            timer_at = Some(at);
        }
        // A future made or reset above has not been polled yet: look at every one once.
        side.woken.store(true, Ordering::Release);
        let event = std::future::poll_fn(|cx| {
            // The connection first: what its client sent before the stop is read before the
            // stop is looked at.
            if let Poll::Ready(ended) = connection.as_mut().poll(cx) {
                return Poll::Ready(Event::Ended(ended));
            }
            if !task_waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                side.set_task(cx.waker().clone());
                task_waker = Some(cx.waker().clone());
            }
            if !side.woken.load(Ordering::Acquire) {
                return Poll::Pending;
            }
            side.woken.store(false, Ordering::Release);
            let mut side_cx = Context::from_waker(&side_waker);
            if closing.is_none() && changed.as_mut().poll(&mut side_cx).is_ready() {
                return Poll::Ready(Event::Changed);
            }
            if closing.is_none()
                && draining.is_none()
                && stop.as_mut().poll(&mut side_cx).is_ready()
            {
                return Poll::Ready(Event::Stopped);
            }
            if wake.is_some() && timer.as_mut().poll(&mut side_cx).is_ready() {
                return Poll::Ready(Event::Timer);
            }
            Poll::Pending
        })
        .await;
        match event {
            Event::Ended(ended) => return ended,
            Event::Changed => changed.set(shared.changed.notified()),
            Event::Stopped => {
                shared.draining.store(true, Ordering::Relaxed);
                let h2 = shared.h2.load(Ordering::Relaxed);
                if h2 || shared.in_flight.load(Ordering::Acquire) > 0 {
                    connection.as_mut().close_gracefully();
                    closing = Some(None);
                } else {
                    draining = Some(Instant::now() + limits.drain);
                }
            }
            Event::Timer => {
                timer_at = None;
                if matches!(closing, Some(Some(until)) if Instant::now() >= until) {
                    tracing::debug!("connection dropped: it did not finish closing in time");
                    return Ok(());
                }
            }
        }
    }
}

/// What woke the loop around a connection.
enum Event<E> {
    /// The connection ended.
    Ended(Result<(), E>),
    /// [`Shared::changed`] was told.
    Changed,
    /// The listener stopped.
    Stopped,
    /// The nearest deadline came.
    Timer,
}

/// The waker the loop around a connection gives its own futures (the stop, a deadline's
/// change, its timer): it notes that one of them woke before waking the connection's task, so
/// that the loop polls them only then, not on each of the connection's own wakes. Polled on
/// every wake, they cost about 1,200 instructions per request.
#[derive(Debug, Default)]
struct SideWake {
    /// Whether one of the loop's futures has woken since they were last polled.
    woken: AtomicBool,
    /// The connection's task.
    task: Mutex<Option<Waker>>,
}

impl SideWake {
    fn set_task(&self, waker: Waker) {
        *self.task.lock().unwrap_or_else(PoisonError::into_inner) = Some(waker);
    }
}

impl Wake for SideWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        if let Some(task) = &*self.task.lock().unwrap_or_else(PoisonError::into_inner) {
            task.wake_by_ref();
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

    /// Reads one answer of [`serving`]'s app (`up`) from `socket`, head and body.
    async fn read_up(socket: &mut TcpStream) {
        let mut answer = Vec::new();
        while !answer.ends_with(b"\r\n\r\nup") {
            let mut byte = [0; 1];
            socket.read_exact(&mut byte).await.unwrap();
            answer.push(byte[0]);
        }
        assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
    }

    /// A kept-alive HTTP/1.1 connection must send its next request head within the header
    /// timeout of its last answer, however long the idle timeout: one that sends nothing, and
    /// one that begins a head and never finishes it (a slowloris after a first request), are
    /// closed, unanswered, then.
    #[tokio::test(start_paused = true)]
    async fn a_kept_alive_connection_whose_next_head_is_late_is_closed_at_the_header_timeout() {
        let limits = ConnectionLimits {
            header_read: Duration::from_secs(10),
            idle: Duration::from_secs(300),
            ..ConnectionLimits::default()
        };
        let (service, addr) = serving(limits).await;
        for sent in [&b""[..], b"GET / HTTP/1.1\r\nHost:"] {
            let mut socket = TcpStream::connect(addr).await.unwrap();
            // Well after connecting, so that only the answer's end can start the deadline.
            tokio::time::sleep(Duration::from_secs(7)).await;
            socket
                .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            read_up(&mut socket).await;
            let answered = Instant::now();
            socket.write_all(sent).await.unwrap();
            let mut rest = Vec::new();
            let read =
                tokio::time::timeout(Duration::from_secs(3600), socket.read_to_end(&mut rest));
            assert!(read.await.is_ok(), "still open after an hour");
            let held = answered.elapsed();
            assert!(
                (Duration::from_secs(10)..Duration::from_secs(11)).contains(&held),
                "{:?} held {held:?}",
                String::from_utf8_lossy(sent)
            );
            assert!(
                rest.is_empty(),
                "answered {:?}",
                String::from_utf8_lossy(&rest)
            );
        }
        service.shutdown().await;
    }

    /// The header deadline of a kept-alive HTTP/1.1 connection counts from each answer: a
    /// client that asks every 6 s is served for a minute, six header timeouts.
    #[tokio::test(start_paused = true)]
    async fn a_kept_alive_connection_that_keeps_asking_is_served() {
        let limits = ConnectionLimits {
            header_read: Duration::from_secs(10),
            idle: Duration::from_secs(300),
            ..ConnectionLimits::default()
        };
        let (service, addr) = serving(limits).await;
        let mut socket = TcpStream::connect(addr).await.unwrap();
        for _ in 0..10 {
            socket
                .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            read_up(&mut socket).await;
            tokio::time::sleep(Duration::from_secs(6)).await;
        }
        socket
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        read_up(&mut socket).await;
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

    /// An answer that never ends, 64 KiB at a time; `dropped` is told (its sender dropped)
    /// when the connection lets it go.
    struct Endless {
        _dropped: tokio::sync::oneshot::Sender<()>,
    }

    impl Body for Endless {
        type Data = bytes::Bytes;
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<bytes::Bytes>, Infallible>>> {
            Poll::Ready(Some(Ok(Frame::data(bytes::Bytes::from_static(
                &[b'x'; 65_536],
            )))))
        }
    }

    use std::convert::Infallible;

    /// Serving an endless answer at `/` (one request's worth), and what tells when it is let go.
    async fn serving_endless(
        limits: ConnectionLimits,
    ) -> (Lifecycle, SocketAddr, tokio::sync::oneshot::Receiver<()>) {
        let (dropped, let_go) = tokio::sync::oneshot::channel();
        let dropped = Arc::new(std::sync::Mutex::new(Some(dropped)));
        let app = axum::Router::new().route(
            "/",
            axum::routing::get(move || async move {
                let dropped = dropped.lock().unwrap().take().expect("one request");
                axum::body::Body::new(Endless { _dropped: dropped })
            }),
        );
        let mut service = Lifecycle::new(limits);
        let addr = service
            .listen(SocketAddr::from(([127, 0, 0, 1], 0)), app)
            .await
            .unwrap();
        (service, addr, let_go)
    }

    /// A client socket with a small receive buffer, so that it fills soon.
    async fn small_buffered(addr: SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4_096).unwrap();
        socket.connect(addr).await.unwrap()
    }

    /// Deadlines long enough not to interfere, and a send timeout of 30 s.
    fn send_limits() -> ConnectionLimits {
        ConnectionLimits {
            header_read: Duration::from_secs(3600),
            idle: Duration::from_secs(3 * 3600),
            send: Duration::from_secs(30),
            ..ConnectionLimits::default()
        }
    }

    /// A download its client never reads: the connection, and the answer with it, are let go
    /// at the send timeout. (Without it, both were held for as long as the client stayed.)
    #[tokio::test(start_paused = true)]
    async fn an_answer_never_read_is_let_go_at_the_send_timeout() {
        let (service, addr, let_go) = serving_endless(send_limits()).await;
        let mut socket = small_buffered(addr).await;
        socket
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let started = Instant::now();
        let held = tokio::time::timeout(Duration::from_secs(3600), let_go).await;
        assert!(held.is_ok(), "still held after an hour");
        let held = started.elapsed();
        assert!(
            (Duration::from_secs(30)..Duration::from_secs(31)).contains(&held),
            "let go after {held:?}"
        );
        drop(socket);
        service.shutdown().await;
    }

    /// A client that reads its download slowly, 1 MiB every 5 s, makes progress: it is never
    /// cut at a send timeout of 30 s. (The kernel lets the server write again only once a third
    /// of its send buffer is free, up to 1.4 MiB of Linux's 4 MiB: a client that reads less than
    /// that in a send timeout is cut, as it would be by nginx's `send_timeout`.)
    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_is_not_cut() {
        let (service, addr, mut let_go) = serving_endless(send_limits()).await;
        // The kernel's own receive buffer: one of 4 KiB opens its window a little at a time,
        // and the server's kernel waits on its real-time persist timer before sending into
        // it, while the test's paused clock runs ahead to the send deadline.
        let mut socket = TcpStream::connect(addr).await.unwrap();
        socket
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut chunk = vec![0; 1024 * 1024];
        for _ in 0..12 {
            tokio::time::sleep(Duration::from_secs(5)).await;
            socket.read_exact(&mut chunk).await.unwrap();
        }
        assert!(
            matches!(
                let_go.try_recv(),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty)
            ),
            "a reader making progress was cut"
        );
        drop(socket);
        service.shutdown().await;
    }

    /// A client that sends 1,000 requests and never reads their answers (16 KiB each, far more
    /// than the sockets' buffers hold): the connection is closed at the send timeout, with
    /// most answers never sent. Read afterwards, it ends within a minute of the test's clock;
    /// without the timeout all 1,000 answers come and it stays open (the idle timeout here is
    /// three hours), and the read times out.
    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_reads_its_answers_is_closed_at_the_send_timeout() {
        let app =
            axum::Router::new().route("/", axum::routing::get(|| async { "x".repeat(16_384) }));
        let mut service = Lifecycle::new(send_limits());
        let addr = service
            .listen(SocketAddr::from(([127, 0, 0, 1], 0)), app)
            .await
            .unwrap();
        let socket = small_buffered(addr).await;
        let (mut reader, mut writer) = socket.into_split();
        // The server stops reading once its answers back up, so the writes may block: they run
        // beside the test, and fail once the server has closed.
        let sending = tokio::spawn(async move {
            let requests = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".repeat(1_000);
            let _ = writer.write_all(&requests).await;
            writer
        });
        // Nothing read for longer than the send timeout, on the test's clock.
        tokio::time::sleep(Duration::from_secs(31)).await;
        let mut received = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(60), reader.read_to_end(&mut received));
        assert!(
            read.await.is_ok(),
            "still open a minute after the send timeout"
        );
        let answers = received
            .windows(12)
            .filter(|w| w == b"HTTP/1.1 200")
            .count();
        assert!(answers < 1_000, "{answers} answers of 1,000 sent");
        drop(sending.await.unwrap());
        service.shutdown().await;
    }
}
