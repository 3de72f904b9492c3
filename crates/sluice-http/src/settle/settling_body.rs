//! An answer's body that settles its request's reservation when it ends or is dropped, read on
//! the way by a [`UsageMeter`] for what to settle at. The gateway's token budgets read the usage
//! the answer reports; a request held by a concurrency limit reads nothing ([`InFull`]): its
//! slot is released when the answer ends, or when the client goes away.
//!
//! When the answer ends, the settle is made before the end (or the last frame, when the inner
//! body's framing says it is the last) is passed on, so a client that has read the whole answer
//! and sends its next request finds the refund made and the slot free. When the answer is cut
//! (the inner body failed) or dropped (the client went away), nothing waits for the settle: it
//! is made in a task, at the larger of the last usage read and the reservation, since the
//! upstream may have gone on working for units it never reported.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::pending_settle::{PendingSettle, spawn};

/// What a [`SettlingBody`] reads of the answer on its way: the usage to settle at.
pub trait UsageMeter<D> {
    /// A frame's data passes.
    fn feed(&mut self, data: &D);
    /// The usage of an answer that ended; `None` when none could be read, and the reservation
    /// is settled in full.
    fn finished(&mut self) -> Option<u64>;
    /// The last usage read from an answer that did not end.
    fn seen(&self) -> Option<u64>;
}

/// A meter that reads nothing: the reservation is settled in full when the answer ends. What a
/// request reserved at its cost keeps its cost, and a concurrency limit's slot is released.
#[derive(Debug, Clone, Copy, Default)]
pub struct InFull;

impl<D> UsageMeter<D> for InFull {
    fn feed(&mut self, _: &D) {}

    fn finished(&mut self) -> Option<u64> {
        None
    }

    fn seen(&self) -> Option<u64> {
        None
    }
}

/// Where the settle stands.
enum Settle<D> {
    /// Nothing to settle: the body passes through.
    Nothing,
    /// Not yet: the answer is passing.
    Pending(PendingSettle),
    /// The answer ended; the settle is under way, and the last frame held back (if the inner
    /// body's framing told that it was the last) and the end are passed on once it is done.
    /// The frame is boxed: a frame may be trailers, a whole field map, and every answer
    /// carries this state (and is moved whole through the layers) though few ever run it.
    Running(
        Pin<Box<dyn Future<Output = ()> + Send>>,
        Option<Box<Frame<D>>>,
    ),
    /// Settled (or handed to a task).
    Done,
}

pin_project! {
    /// An answer that settles its reservation, once, when it ends or is dropped.
    pub struct SettlingBody<B: Body, M: UsageMeter<B::Data>> {
        #[pin]
        inner: B,
        meter: M,
        settle: Settle<B::Data>,
    }

    impl<B: Body, M: UsageMeter<B::Data>> PinnedDrop for SettlingBody<B, M> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // An answer without a body (a 204, a HEAD) may never be polled: it ended all the
            // same.
            if matches!(this.settle, Settle::Pending(_)) && this.inner.is_end_stream() {
                if let Settle::Pending(pending) = std::mem::replace(this.settle, Settle::Done) {
                    let used = this.meter.finished().unwrap_or(pending.reserved());
                    pending.settle_later(used);
                }
                return;
            }
            interrupted(this.settle, this.meter);
        }
    }
}

impl<B: Body, M: UsageMeter<B::Data>> std::fmt::Debug for SettlingBody<B, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SettlingBody").finish_non_exhaustive()
    }
}

impl<B: Body, M: UsageMeter<B::Data>> SettlingBody<B, M> {
    /// `inner`, read by `meter`, settling `pending` (passed through untouched when `None`).
    pub fn new(inner: B, meter: M, pending: Option<PendingSettle>) -> Self {
        SettlingBody {
            inner,
            meter,
            settle: pending.map_or(Settle::Nothing, Settle::Pending),
        }
    }
}

/// The answer ended: start settling with its usage, holding back `last`.
fn finish<D, M: UsageMeter<D>>(settle: &mut Settle<D>, meter: &mut M, last: Option<Frame<D>>) {
    if let Settle::Pending(pending) = std::mem::replace(settle, Settle::Done) {
        let used = meter.finished().unwrap_or(pending.reserved());
        *settle = Settle::Running(Box::pin(pending.settle(used)), last.map(Box::new));
    }
}

/// The answer was cut or dropped: settle at the larger of what was seen and what was reserved,
/// in a task, since nothing waits for it.
fn interrupted<D, M: UsageMeter<D>>(settle: &mut Settle<D>, meter: &M) {
    match std::mem::replace(settle, Settle::Done) {
        Settle::Pending(pending) => {
            let used = meter.seen().unwrap_or(0).max(pending.reserved());
            pending.settle_later(used);
        }
        // The answer had ended; let its settle finish.
        Settle::Running(task, _) => spawn(task),
        Settle::Nothing => *settle = Settle::Nothing,
        Settle::Done => {}
    }
}

impl<B: Body, M: UsageMeter<B::Data>> Body for SettlingBody<B, M> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut this = self.project();
        loop {
            match this.settle {
                Settle::Nothing => return this.inner.poll_frame(cx),
                Settle::Pending(_) => {}
                Settle::Running(task, last) => {
                    ready!(task.as_mut().poll(cx));
                    let last = last.take();
                    *this.settle = Settle::Done;
                    return Poll::Ready(last.map(|frame| Ok(*frame)));
                }
                Settle::Done => return Poll::Ready(None),
            }
            match ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        this.meter.feed(data);
                    }
                    if !this.inner.is_end_stream() {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    // The framing says this is the last: a client would be done on it.
                    finish(this.settle, this.meter, Some(frame));
                }
                Some(Err(e)) => {
                    interrupted(this.settle, this.meter);
                    return Poll::Ready(Some(Err(e)));
                }
                None => finish(this.settle, this.meter, None),
            }
        }
    }

    /// Not before the settle is done: the end is what tells the client it may go on.
    fn is_end_stream(&self) -> bool {
        match self.settle {
            Settle::Nothing => self.inner.is_end_stream(),
            Settle::Done => true,
            Settle::Pending(_) | Settle::Running(..) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
