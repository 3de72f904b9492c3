//! The body of an answer on a budgeted route: the upstream's, passed on frame by frame as it
//! arrives, read on the way for the usage it reports. It settles as every reservation's answer
//! does (`sluice_http::settle::SettlingBody`): before the end is passed on when it ends, in a
//! task when it is cut or dropped.
//!
//! What is settled (see `docs/usage-limits.md`, "Gateway"):
//! - the answer ended: the usage read (the JSON body's, or the last usage event's); when none
//!   could be read, the reservation in full;
//! - the answer was cut (the upstream failed mid-body) or dropped (the client went away): the
//!   larger of the last usage read and the reservation, since the upstream may have gone on
//!   working for units it never reported.

use bytes::Bytes;
use http::HeaderMap;
use http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use sluice_http::settle::{PendingSettle, SettlingBody, UsageMeter};
use sluice_rules::JsonPath;

use super::json_units::units_in;
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

/// What a budgeted route's answer is read for: its usage, by its content type.
#[derive(Debug)]
pub struct AnswerMeter(Meter);

impl UsageMeter<Bytes> for AnswerMeter {
    fn feed(&mut self, data: &Bytes) {
        self.0.feed(data);
    }

    fn finished(&mut self) -> Option<u64> {
        self.0.finished()
    }

    fn seen(&self) -> Option<u64> {
        self.0.seen()
    }
}

/// An upstream answer that settles its reservation when it ends or is dropped, at the usage it
/// reports.
pub type UsageBody = SettlingBody<UpstreamBody, AnswerMeter>;

/// Reads `inner`, an answer with `headers`, for the units at `path`, and settles `pending`.
pub(crate) fn usage_body(
    inner: UpstreamBody,
    headers: &HeaderMap,
    path: JsonPath,
    pending: PendingSettle,
) -> UsageBody {
    SettlingBody::new(
        inner,
        AnswerMeter(Meter::for_answer(headers, path)),
        Some(pending),
    )
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
