//! The body of an answer on a budgeted route: the upstream's, passed on frame by frame as it
//! arrives, read on the way for the usage it reports. When it ends, the reservation is settled
//! before the end (or the last frame, when the upstream's framing says it is the last) is
//! passed on, so a client that has read the whole answer finds the refund made.
//!
//! What is settled (see `docs/usage-limits.md`, "Gateway"):
//! - the answer ended: the usage read (the JSON body's, or the last usage event's); when none
//!   could be read, the reservation in full;
//! - the answer was cut (the upstream failed mid-body) or dropped (the client went away): the
//!   larger of the last usage read and the reservation, since the upstream may have gone on
//!   working for units it never reported.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use http_body::{Body, Frame, SizeHint};
use sluice_rules::JsonPath;

use super::json_units::units_in;
use super::pending_settle::{PendingSettle, spawn};
use super::sse_scanner::SseScanner;
use crate::UpstreamBody;

/// The largest JSON answer whose usage is read. A copy of the body is kept until it ends; a
/// larger one is passed on unread and settles the reservation in full.
pub(crate) const MAX_JSON_ANSWER: usize = 4 * 1024 * 1024;

/// How the answer's usage is read, by its content type.
#[derive(Debug)]
enum Meter {
    /// `text/event-stream`: events are read as they pass.
    Events(SseScanner),
    /// A JSON body: kept, up to [`MAX_JSON_ANSWER`], and read when it ends.
    Json {
        path: JsonPath,
        kept: Vec<u8>,
        too_long: bool,
    },
    /// Anything else (or a compressed body): no usage can be read.
    Unreadable,
}

impl Meter {
    fn for_answer(headers: &HeaderMap, path: JsonPath) -> Meter {
        if headers.contains_key(CONTENT_ENCODING) {
            return Meter::Unreadable;
        }
        let content_type = headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase();
        let essence = content_type.split(';').next().unwrap_or_default().trim();
        if essence == "text/event-stream" {
            Meter::Events(SseScanner::new(path))
        } else if essence == "application/json" || essence.ends_with("+json") {
            Meter::Json {
                path,
                kept: Vec::new(),
                too_long: false,
            }
        } else {
            Meter::Unreadable
        }
    }

    fn feed(&mut self, bytes: &Bytes) {
        match self {
            Meter::Events(scanner) => scanner.feed(bytes),
            Meter::Json { too_long: true, .. } => {}
            Meter::Json { kept, too_long, .. } => {
                if kept.len() + bytes.len() > MAX_JSON_ANSWER {
                    *too_long = true;
                    *kept = Vec::new();
                } else {
                    kept.extend_from_slice(bytes);
                }
            }
            Meter::Unreadable => {}
        }
    }

    /// The usage of an answer that ended.
    fn finished(&mut self) -> Option<u64> {
        match self {
            Meter::Events(scanner) => scanner.finish(),
            Meter::Json {
                path,
                kept,
                too_long: false,
            } => units_in(kept, path),
            _ => None,
        }
    }

    /// The last usage read from an answer that did not end.
    fn seen(&self) -> Option<u64> {
        match self {
            Meter::Events(scanner) => scanner.last_usage(),
            _ => None,
        }
    }
}

/// Where the settle stands.
enum Settle {
    /// Not yet: the answer is passing.
    Pending(PendingSettle),
    /// The answer ended; the settle is under way, and the last frame held back (if the
    /// upstream's framing told that it was the last) and the end are passed on once it is done.
    Running(
        Pin<Box<dyn Future<Output = ()> + Send>>,
        Option<Frame<Bytes>>,
    ),
    /// Settled (or handed to a task).
    Done,
}

/// An upstream answer that settles its reservation when it ends or is dropped.
pub struct UsageBody {
    inner: UpstreamBody,
    meter: Meter,
    settle: Settle,
}

impl std::fmt::Debug for UsageBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageBody")
            .field("inner", &self.inner)
            .field("meter", &self.meter)
            .finish_non_exhaustive()
    }
}

impl UsageBody {
    /// Reads `inner`, an answer with `headers`, for the units at `path`, and settles `pending`.
    pub(crate) fn new(
        inner: UpstreamBody,
        headers: &HeaderMap,
        path: JsonPath,
        pending: PendingSettle,
    ) -> Self {
        UsageBody {
            inner,
            meter: Meter::for_answer(headers, path),
            settle: Settle::Pending(pending),
        }
    }

    /// The answer ended: start settling with its usage, holding back `last`.
    fn finish(&mut self, last: Option<Frame<Bytes>>) {
        if let Settle::Pending(pending) = std::mem::replace(&mut self.settle, Settle::Done) {
            let used = self.meter.finished().unwrap_or(pending.reserved());
            self.settle = Settle::Running(Box::pin(pending.settle(used)), last);
        }
    }

    /// The answer was cut or dropped: settle at the larger of what was seen and what was
    /// reserved, in a task, since nothing waits for it.
    fn settle_interrupted(&mut self) {
        match std::mem::replace(&mut self.settle, Settle::Done) {
            Settle::Pending(pending) => {
                let used = self.meter.seen().unwrap_or(0).max(pending.reserved());
                pending.settle_later(used);
            }
            // The answer had ended; let its settle finish.
            Settle::Running(task, _) => spawn(task),
            Settle::Done => {}
        }
    }
}

impl Body for UsageBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        loop {
            match &mut this.settle {
                Settle::Pending(_) => {}
                Settle::Running(task, last) => {
                    ready!(task.as_mut().poll(cx));
                    let last = last.take();
                    this.settle = Settle::Done;
                    return Poll::Ready(last.map(Ok));
                }
                Settle::Done => return Poll::Ready(None),
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        this.meter.feed(data);
                    }
                    if !this.inner.is_end_stream() {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    // `Content-Length` says this is the last: a client would be done on it.
                    this.finish(Some(frame));
                }
                Some(Err(e)) => {
                    this.settle_interrupted();
                    return Poll::Ready(Some(Err(e)));
                }
                None => this.finish(None),
            }
        }
    }

    /// Not before the settle is done: the end is what tells the client it may go on.
    fn is_end_stream(&self) -> bool {
        matches!(self.settle, Settle::Done)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UsageBody {
    fn drop(&mut self) {
        // An answer without a body (a 204, a HEAD) may never be polled: it ended all the same.
        if matches!(self.settle, Settle::Pending(_)) && self.inner.is_end_stream() {
            if let Settle::Pending(pending) = std::mem::replace(&mut self.settle, Settle::Done) {
                let used = self.meter.finished().unwrap_or(pending.reserved());
                pending.settle_later(used);
            }
            return;
        }
        self.settle_interrupted();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meter(pairs: &[(&'static str, &'static str)]) -> Meter {
        let mut headers = HeaderMap::new();
        for (k, v) in pairs {
            headers.insert(*k, http::HeaderValue::from_static(v));
        }
        Meter::for_answer(&headers, JsonPath::parse("usage.total_tokens").unwrap())
    }

    #[test]
    fn the_content_type_says_how_usage_is_read() {
        for json in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/vnd.api+json",
        ] {
            assert!(
                matches!(meter(&[("content-type", json)]), Meter::Json { .. }),
                "{json}"
            );
        }
        for events in ["text/event-stream", "text/event-stream; charset=utf-8"] {
            assert!(
                matches!(meter(&[("content-type", events)]), Meter::Events(_)),
                "{events}"
            );
        }
        for unreadable in [
            &[("content-type", "text/plain")][..],
            &[][..],
            &[
                ("content-type", "application/json"),
                ("content-encoding", "gzip"),
            ][..],
        ] {
            assert!(
                matches!(meter(unreadable), Meter::Unreadable),
                "{unreadable:?}"
            );
        }
    }

    #[test]
    fn a_json_answer_is_read_when_it_ends_and_not_past_its_bound() {
        let mut m = meter(&[("content-type", "application/json")]);
        m.feed(&Bytes::from_static(b"{\"usage\":{\"total_"));
        assert_eq!(m.seen(), None, "a JSON answer is read only whole");
        m.feed(&Bytes::from_static(b"tokens\":12}}"));
        assert_eq!(m.finished(), Some(12));

        let mut big = meter(&[("content-type", "application/json")]);
        big.feed(&Bytes::from_static(
            b"{\"usage\":{\"total_tokens\":12},\"pad\":\"",
        ));
        big.feed(&Bytes::from(vec![b'x'; MAX_JSON_ANSWER]));
        big.feed(&Bytes::from_static(b"\"}"));
        assert_eq!(big.finished(), None);
        assert!(matches!(big, Meter::Json { ref kept, .. } if kept.capacity() == 0));
    }
}
