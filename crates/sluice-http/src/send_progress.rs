//! When a connection's socket stops taking what the server writes, told by watching its writes,
//! so that a client that never reads its answers is closed at the send timeout.
//!
//! A client that sends requests and never reads the answers fills its receive buffer, then the
//! server's send buffer; from then on every write of the connection returns `Pending`, and the
//! answers hyper has not written yet (a `/metrics` page, a proxied download, the answers of a
//! pipeline of requests) wait in memory with the connection, for as long as the client stays.
//! [`SendProgress`] wraps the connection's socket and tells its [`Activity`] when a write first
//! blocks and when one makes progress again; the connection is closed once its writes have
//! been blocked for [`ConnectionLimits::send`](crate::serve::ConnectionLimits::send), as
//! nginx's `send_timeout` does (`connection_deadlines`). A client that reads slowly makes
//! progress and is never cut: only a write that moves no byte for that long counts.
//!
//! An h2 client can stall an answer without filling any buffer, by granting no flow-control
//! window: that is seen at the answer's body instead, which hyper stops asking for
//! ([`Tracked`](crate::connection_deadlines::Tracked)).

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::connection_deadlines::Activity;

pin_project_lite::pin_project! {
    /// A connection's socket, whose blocked writes are reported to its [`Activity`].
    #[derive(Debug)]
    pub struct SendProgress<T> {
        #[pin]
        io: T,
        activity: Activity,
        // Whether the last write returned `Pending`: told to the activity only when
        // it changes, so that a flowing connection costs no more than a branch per write.
        blocked: bool,
    }
}

impl<T> SendProgress<T> {
    /// `io`, reporting to `activity`.
    pub fn new(io: T, activity: Activity) -> Self {
        SendProgress {
            io,
            activity,
            blocked: false,
        }
    }
}

/// What a write's `poll` says about progress: `Pending` blocks, anything else (bytes written,
/// or an error that will end the connection) does not.
fn observe<R>(blocked: &mut bool, activity: &Activity, poll: &Poll<R>) {
    let now_blocked = poll.is_pending();
    if now_blocked != *blocked {
        *blocked = now_blocked;
        activity.send_blocked(now_blocked);
    }
}

impl<T: AsyncRead> AsyncRead for SendProgress<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.project().io.poll_read(cx, buf)
    }
}

impl<T: AsyncWrite> AsyncWrite for SendProgress<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        let poll = this.io.poll_write(cx, buf);
        observe(this.blocked, this.activity, &poll);
        poll
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        let poll = this.io.poll_write_vectored(cx, bufs);
        observe(this.blocked, this.activity, &poll);
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    /// Not watched: what is flushed was written, and the writes are watched.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}
