//! A gRPC request's body that must end within a deadline of its head.
//!
//! An h2 stream whose client sends HEADERS and never ends its message holds its place among
//! the connection's streams, and what was sent of it, for as long as the client likes: one
//! connection with a million such streams held 3 GB. With the body past its deadline failing
//! as `DEADLINE_EXCEEDED`, the service answers with that status (trailers only) and the stream
//! is reset, its place and memory given back. `DEADLINE_EXCEEDED` rather than `CANCELLED`: the
//! call did not complete in the time it was given, which is what that status says; `CANCELLED`
//! says the caller gave up, and here the caller is the one that is late.
//!
//! The timer is armed only when a read has to wait: a message that arrives with its head, as
//! Envoy sends it, costs no timer.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// What a [`BodyDeadline`] fails with: the body's own error, or a [`tonic::Status`] of
/// `DEADLINE_EXCEEDED`, which tonic's services and [`unary`](crate::unary) answer as it is.
pub(crate) type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// `B`, failing with `DEADLINE_EXCEEDED` once it has not ended within its time.
#[derive(Debug)]
pub(crate) struct BodyDeadline<B> {
    body: B,
    /// When the body must have ended.
    deadline: Instant,
    /// How long it was given, for the status's message.
    within: Duration,
    /// Armed at the first read that waits.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<B> BodyDeadline<B> {
    /// `body`, which must end within `within` from now.
    pub(crate) fn new(body: B, within: Duration) -> Self {
        BodyDeadline {
            body,
            deadline: Instant::now() + within,
            within,
            timer: None,
        }
    }
}

impl<B> Body for BodyDeadline<B>
where
    B: Body + Unpin,
    B::Error: Into<BodyError>,
{
    type Data = B::Data;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, BodyError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => return Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending => {}
        }
        let deadline = this.deadline;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(tonic::Status::deadline_exceeded(
                format!(
                    "the request's message was not complete within {:?} of its head",
                    this.within
                ),
            ))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http_body_util::BodyExt;

    use super::*;

    /// A body that sends one frame and then never another, nor its end.
    struct Stalled(Option<Bytes>);

    impl Body for Stalled {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            match self.0.take() {
                Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                None => Poll::Pending,
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_does_not_end_in_time_fails_with_deadline_exceeded() {
        let sent = Bytes::from_static(b"\0\0");
        let mut body = BodyDeadline::new(Stalled(Some(sent.clone())), Duration::from_secs(10));
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), sent);

        let started = Instant::now();
        let error = body.frame().await.unwrap().unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        let status = error.downcast_ref::<tonic::Status>().unwrap();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    }
}
