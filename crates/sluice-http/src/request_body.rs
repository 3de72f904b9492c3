//! The body of a request a listener received: streamed by hyper, or already whole, as
//! [`h1_server`](crate::h1_server) reads the small bodies of the common case together with their
//! head.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// A request's body as a listener's service receives it.
#[derive(Debug)]
pub struct RequestBody {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// Streamed by hyper as it arrives.
    Streamed(Incoming),
    /// All of it, read with the head; `None` once taken.
    Whole(Option<Bytes>),
}

impl RequestBody {
    /// A body whose bytes have all arrived.
    pub fn whole(bytes: Bytes) -> Self {
        RequestBody {
            kind: Kind::Whole((!bytes.is_empty()).then_some(bytes)),
        }
    }

    /// The body's bytes when they have all arrived and none has been taken: a service that
    /// needs the whole body (to forward it framed by its length, to parse it) takes it without
    /// polling.
    pub fn as_whole(&self) -> Option<&Bytes> {
        match &self.kind {
            Kind::Whole(Some(bytes)) => Some(bytes),
            _ => None,
        }
    }
}

impl From<Incoming> for RequestBody {
    fn from(body: Incoming) -> Self {
        RequestBody {
            kind: Kind::Streamed(body),
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match &mut self.get_mut().kind {
            Kind::Streamed(body) => Pin::new(body).poll_frame(cx),
            Kind::Whole(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Streamed(body) => body.is_end_stream(),
            Kind::Whole(bytes) => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Streamed(body) => body.size_hint(),
            Kind::Whole(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn a_whole_body_is_one_frame_of_its_exact_size() {
        let body = RequestBody::whole(Bytes::from_static(b"{\"a\":1}"));
        assert_eq!(body.size_hint().exact(), Some(7));
        assert_eq!(body.as_whole().map(|b| b.len()), Some(7));
        assert!(!body.is_end_stream());
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"{\"a\":1}");
        let empty = RequestBody::whole(Bytes::new());
        assert!(empty.is_end_stream());
        assert_eq!(empty.size_hint().exact(), Some(0));
        assert!(empty.collect().await.unwrap().to_bytes().is_empty());
    }
}
