//! The body of an upstream answer, streamed to the client, and the return of its connection to
//! the pool when it has been read to its end.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;

use crate::answer_framing::{Decoder, Step};
use crate::forward::RequestBody;
use crate::h1_connection::H1Connection;
use crate::upstream_pool::UpstreamPool;

/// The body of an upstream answer. Read to the end, it gives its connection back to the pool;
/// dropped before that, it closes the connection, which could not carry another exchange.
#[derive(Debug)]
pub struct UpstreamBody(Inner);

/// The common case inline, the others boxed: an answer is moved whole through every layer
/// on its way out (ten moves or so), and a body the size of a connection (128 bytes, where
/// the whole body's bytes take 32) makes each of them a copy of twice as much.
#[derive(Debug)]
enum Inner {
    /// The whole body, read with the head; its connection is already back in the pool.
    Whole(Option<Bytes>),
    /// Read from a connection of the gateway's own HTTP/1.1 client as the client takes it.
    Streamed(Box<Streamed>),
    /// An answer through hyper's client: h2, or a request whose body streams.
    Hyper(Box<HyperBody>),
}

/// An answer's body through hyper's client, and the connection it holds until its end.
#[derive(Debug)]
struct HyperBody {
    body: Incoming,
    lease: Option<Lease>,
}

/// A body read from its connection, which goes back to the pool at the body's end.
struct Streamed {
    /// `None` once the body has ended or failed.
    connection: Option<H1Connection>,
    decoder: Decoder,
    keep_alive: bool,
    pool: Arc<UpstreamPool>,
}

/// A hyper connection lent to one exchange.
pub(crate) struct Lease {
    pub(crate) upstream: Arc<UpstreamPool>,
    pub(crate) sender: http1::SendRequest<RequestBody>,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease").finish_non_exhaustive()
    }
}

impl fmt::Debug for Streamed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Streamed")
            .field("decoder", &self.decoder)
            .field("keep_alive", &self.keep_alive)
            .finish_non_exhaustive()
    }
}

impl UpstreamBody {
    pub(crate) fn whole(bytes: Bytes) -> Self {
        UpstreamBody(Inner::Whole((!bytes.is_empty()).then_some(bytes)))
    }

    pub(crate) fn streamed(
        connection: H1Connection,
        decoder: Decoder,
        keep_alive: bool,
        pool: Arc<UpstreamPool>,
    ) -> Self {
        UpstreamBody(Inner::Streamed(Box::new(Streamed {
            connection: Some(connection),
            decoder,
            keep_alive,
            pool,
        })))
    }

    pub(crate) fn hyper(body: Incoming, lease: Option<Lease>) -> Self {
        UpstreamBody(Inner::Hyper(Box::new(HyperBody { body, lease })))
    }
}

impl Streamed {
    /// The body has ended: its connection goes back when it may carry another exchange and
    /// nothing unasked follows the body.
    fn finish(&mut self) {
        if let Some(connection) = self.connection.take()
            && self.keep_alive
            && connection.buf.is_empty()
        {
            self.pool.put_h1(connection);
        }
    }

    fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        loop {
            let Some(connection) = self.connection.as_mut() else {
                return Poll::Ready(None);
            };
            let step = match self.decoder.decode(&mut connection.buf) {
                Ok(step) => step,
                Err(e) => {
                    self.connection = None;
                    return Poll::Ready(Some(Err(e)));
                }
            };
            match step {
                Step::Data(data) => {
                    if self.decoder.is_done() {
                        self.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Step::End => {
                    self.finish();
                    return Poll::Ready(None);
                }
                Step::NeedMore => match ready!(connection.poll_read(cx)) {
                    Ok(0) => {
                        let closed = self.decoder.closed();
                        self.connection = None;
                        return Poll::Ready(closed.err().map(Err));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        self.connection = None;
                        return Poll::Ready(Some(Err(e)));
                    }
                },
            }
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match &mut self.0 {
            Inner::Whole(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Inner::Streamed(streamed) => streamed.poll_frame(cx),
            Inner::Hyper(hyper) => {
                let HyperBody { body, lease } = &mut **hyper;
                let frame = ready!(Pin::new(&mut *body).poll_frame(cx));
                match &frame {
                    None => release(lease),
                    Some(Ok(_)) if body.is_end_stream() => release(lease),
                    Some(Err(_)) => *lease = None,
                    Some(Ok(_)) => {}
                }
                Poll::Ready(frame.map(|f| f.map_err(io::Error::other)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Inner::Whole(bytes) => bytes.is_none(),
            Inner::Streamed(s) => s.connection.is_none() || s.decoder.is_done(),
            Inner::Hyper(hyper) => hyper.body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Inner::Whole(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            Inner::Streamed(s) => s
                .decoder
                .remaining()
                .map_or_else(SizeHint::default, SizeHint::with_exact),
            Inner::Hyper(hyper) => hyper.body.size_hint(),
        }
    }
}

fn release(lease: &mut Option<Lease>) {
    if let Some(lease) = lease.take() {
        lease.upstream.put_hyper(lease.sender);
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // An answer without a body (a 204, a HEAD, `Content-Length: 0`) is never polled.
        if let Inner::Hyper(hyper) = &mut self.0
            && hyper.body.is_end_stream()
        {
            release(&mut hyper.lease);
        }
    }
}
