//! One HTTP/1.1 connection to the upstream, driven by the request that holds it: the request's
//! head is written and the answer's head read on that request's task, and the body is read as
//! the client's side polls it. There is no connection task and no channel between them, which is
//! where hyper's client spends most of its instructions for a small exchange.
//!
//! What it carries is the common case only (see [`crate::upstream_pool`] for what goes through
//! hyper instead): a request whose body is whole by the time it is sent (none, or bytes already
//! read), and answers framed by length, chunks, or the connection's end (RFC 9112 §6.3).

use std::future::{Future, poll_fn};
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, Waker, ready};

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderValue, Method, StatusCode, Version, request};
use sluice_http::h1_server::{INLINE_FIELDS, field_name, field_places};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::answer_framing::Framing;

/// The most fields an answer's head may have, as hyper allows.
const MAX_FIELDS: usize = 100;

/// The longest answer head accepted; hyper's client allows about as much before it refuses.
const MAX_HEAD: usize = 64 * 1024;

/// How much room each read is given: a small answer arrives whole in one read, and a large
/// body streams in pieces of this size.
const READ_SIZE: usize = 16 * 1024;

/// The most room a connection keeps for writing request heads between exchanges.
const KEEP_OUT: usize = 16 * 1024;

/// A connection to the upstream and the bytes read from it not yet used.
#[derive(Debug)]
pub(crate) struct H1Connection {
    stream: TcpStream,
    /// Read and not yet taken: the rest of an answer's head or body.
    pub(crate) buf: BytesMut,
    /// The request head being written, kept for the next request's.
    out: Vec<u8>,
    /// The upstream timeout of the exchange under way. One timer for the connection's life,
    /// moved to each exchange's deadline: moving a registered timer later is one atomic
    /// operation, where a timer per request is registered in the runtime's wheel and removed
    /// again each time.
    timer: Pin<Box<Sleep>>,
}

/// How an exchange failed, and so whether it may be tried again on another connection.
#[derive(Debug)]
pub(crate) struct ExchangeError {
    pub(crate) error: io::Error,
    /// The first write failed with nothing of the request accepted: the upstream cannot have
    /// seen it.
    pub(crate) unsent: bool,
    /// The request was written, and the connection ended before any byte of an answer.
    pub(crate) unanswered: bool,
    /// The deadline passed before the answer's head was read.
    pub(crate) timed_out: bool,
}

impl ExchangeError {
    fn other(error: io::Error) -> Self {
        ExchangeError {
            error,
            unsent: false,
            unanswered: false,
            timed_out: false,
        }
    }

    fn unanswered(error: io::Error, unanswered: bool) -> Self {
        ExchangeError {
            unanswered,
            ..ExchangeError::other(error)
        }
    }

    fn unsent(error: io::Error, unsent: bool) -> Self {
        ExchangeError {
            unsent,
            ..ExchangeError::other(error)
        }
    }
}

/// An answer's head, and how its body is framed on this connection.
#[derive(Debug)]
pub(crate) struct AnswerHead {
    pub(crate) status: StatusCode,
    pub(crate) version: Version,
    pub(crate) headers: HeaderMap,
    pub(crate) framing: Framing,
    /// Whether the connection can carry another exchange once the body has been read.
    pub(crate) keep_alive: bool,
}

impl H1Connection {
    pub(crate) fn new(stream: TcpStream, deadline: Instant) -> Self {
        H1Connection {
            stream,
            buf: BytesMut::new(),
            out: Vec::new(),
            timer: Box::pin(tokio::time::sleep_until(deadline)),
        }
    }

    /// Whether the upstream has closed this idle connection, or sent on it unasked, as far as
    /// the runtime has seen: either way it cannot carry a request. Costs no system call; an
    /// answer read to its end left the socket not readable.
    pub(crate) fn is_stale(&self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        !self.buf.is_empty() || self.stream.poll_read_ready(&mut cx).is_ready()
    }

    /// Writes the request and reads the head of its answer, past any interim (1xx) answers,
    /// by `deadline`. `body` is the whole request body, or `None` when the request has none
    /// (its fields, `Content-Length` included, go as they are).
    pub(crate) async fn exchange(
        &mut self,
        parts: &request::Parts,
        body: Option<&Bytes>,
        deadline: Instant,
    ) -> Result<AnswerHead, ExchangeError> {
        let H1Connection {
            stream,
            buf,
            out,
            timer,
        } = self;
        timer.as_mut().reset(deadline);
        let mut exchange = std::pin::pin!(unbounded(stream, buf, out, parts, body));
        poll_fn(|cx| {
            if let Poll::Ready(done) = exchange.as_mut().poll(cx) {
                return Poll::Ready(done);
            }
            ready!(timer.as_mut().poll(cx));
            Poll::Ready(Err(ExchangeError {
                timed_out: true,
                ..ExchangeError::other(io::ErrorKind::TimedOut.into())
            }))
        })
        .await
    }

    /// Reads what the socket has into the buffer: how many bytes, 0 at the connection's end.
    pub(crate) fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        poll_read(&mut self.stream, &mut self.buf, cx)
    }
}

/// [`H1Connection::exchange`] without its deadline.
async fn unbounded(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    out: &mut Vec<u8>,
    parts: &request::Parts,
    body: Option<&Bytes>,
) -> Result<AnswerHead, ExchangeError> {
    out.clear();
    write_head(out, parts, body);
    write_out(stream, out).await?;
    if out.capacity() > KEEP_OUT {
        // A large body was written: an idle connection keeps no copy of its room.
        *out = Vec::new();
    }
    let mut answered = false;
    loop {
        if !buf.is_empty() {
            answered = true;
            match parse_head(buf, parts.method == Method::HEAD) {
                Ok(Some(head)) if head.status.is_informational() => continue,
                Ok(Some(head)) => return Ok(head),
                Ok(None) if buf.len() >= MAX_HEAD => {
                    return Err(ExchangeError::other(invalid(
                        "the answer's head is too long",
                    )));
                }
                Ok(None) => {}
                Err(e) => return Err(ExchangeError::other(e)),
            }
        }
        match poll_fn(|cx| poll_read(stream, buf, cx)).await {
            Ok(0) => {
                return Err(ExchangeError::unanswered(
                    io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the upstream closed the connection before answering",
                    ),
                    !answered,
                ));
            }
            Ok(_) => {}
            Err(error) => return Err(ExchangeError::unanswered(error, !answered)),
        }
    }
}

/// Writes the request head (and body) in `out`, in one system call when the socket takes it,
/// as it usually does.
async fn write_out(stream: &mut TcpStream, out: &[u8]) -> Result<(), ExchangeError> {
    let mut written = 0;
    while written < out.len() {
        let rest = &out[written..];
        match poll_fn(|cx| Pin::new(&mut *stream).poll_write(cx, rest)).await {
            Ok(0) => {
                return Err(ExchangeError::unsent(
                    io::ErrorKind::WriteZero.into(),
                    written == 0,
                ));
            }
            Ok(n) => written += n,
            Err(error) => return Err(ExchangeError::unsent(error, written == 0)),
        }
    }
    Ok(())
}

/// Reads what `stream` has into `buf`: how many bytes, 0 at the connection's end. A read that
/// leaves room in the buffer tells the runtime the socket is drained, so
/// [`H1Connection::is_stale`] sees only what arrives after it.
fn poll_read(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    if buf.capacity() - buf.len() < READ_SIZE / 4 {
        buf.reserve(READ_SIZE);
    }
    let n = ready!(tokio_util::io::poll_read_buf(Pin::new(stream), cx, buf))?;
    Poll::Ready(Ok(n))
}

/// The request head, HTTP/1.1 in origin form, and the body when there is one.
fn write_head(out: &mut Vec<u8>, parts: &request::Parts, body: Option<&Bytes>) {
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    out.extend_from_slice(if target.is_empty() { "/" } else { target }.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &parts.headers {
        // A whole body is framed by its own length, whatever the client's said.
        if body.is_some() && *name == CONTENT_LENGTH {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(body) = body {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
        out.extend_from_slice(b"\r\n\r\n");
        out.extend_from_slice(body);
    } else {
        out.extend_from_slice(b"\r\n");
    }
}

/// Where one field's name and value lie in the head, as offsets and lengths.
#[derive(Clone, Copy, Default)]
struct FieldAt {
    name: u32,
    name_len: u32,
    value: u32,
    value_len: u32,
}

impl FieldAt {
    fn name(self) -> std::ops::Range<usize> {
        self.name as usize..(self.name + self.name_len) as usize
    }

    fn value(self) -> std::ops::Range<usize> {
        self.value as usize..(self.value + self.value_len) as usize
    }
}

/// Parses an answer head from the front of `buf`, taking it off: `None` until it is whole. The
/// fields' values share the head's bytes rather than copy them.
fn parse_head(buf: &mut BytesMut, head_request: bool) -> Result<Option<AnswerHead>, io::Error> {
    let mut storage = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
    let mut inline = [FieldAt::default(); INLINE_FIELDS];
    let mut spilled = Vec::new();
    let base = buf.as_ptr() as usize;
    let (len, code, minor, at) = {
        let mut answer = httparse::Response::new(&mut []);
        let status = httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut answer, buf, &mut storage)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let httparse::Status::Complete(len) = status else {
            return Ok(None);
        };
        // The head is far shorter than 4 GiB: it is read only up to `MAX_HEAD` and one more
        // read.
        let offset = |p: *const u8| (p as usize - base) as u32;
        let at = field_places(&mut inline, &mut spilled, answer.headers.len());
        for (field, at) in answer.headers.iter().zip(at.iter_mut()) {
            *at = FieldAt {
                name: offset(field.name.as_ptr()),
                name_len: field.name.len() as u32,
                value: offset(field.value.as_ptr()),
                value_len: field.value.len() as u32,
            };
        }
        (
            len,
            answer.code.unwrap_or(0),
            answer.version.unwrap_or(1),
            at,
        )
    };
    let head = buf.split_to(len).freeze();
    let status = StatusCode::from_u16(code).map_err(|_| invalid("the status is not a number"))?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        // The gateway never asks to upgrade.
        return Err(invalid("the upstream switched protocols unasked"));
    }
    // Room for the fields the gateway adds to an answer (the limits' `RateLimit` fields), so
    // that adding them does not grow the map.
    let mut headers = HeaderMap::with_capacity(at.len() + 4);
    let mut length: Option<u64> = None;
    let mut chunked = None;
    let mut close = minor == 0;
    for &at in at.iter() {
        let name =
            field_name(&head[at.name()]).map_err(|_| invalid("a field name is not valid"))?;
        let value = HeaderValue::from_maybe_shared(head.slice(at.value()))
            .map_err(|_| invalid("a field value is not valid"))?;
        if name == CONTENT_LENGTH {
            let n = content_length(value.as_bytes())?;
            if length.is_some_and(|l| l != n) {
                return Err(invalid("the Content-Length fields disagree"));
            }
            length = Some(n);
        } else if name == TRANSFER_ENCODING {
            // Only the last coding says whether the body is chunked.
            let last = value
                .as_bytes()
                .rsplit(|&b| b == b',')
                .next()
                .unwrap_or_default();
            chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name == CONNECTION {
            for token in value.as_bytes().split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if minor == 0 && token.eq_ignore_ascii_case(b"keep-alive") {
                    close = false;
                }
            }
        }
        headers.append(name, value);
    }
    let framing = if head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        Framing::Empty
    } else {
        match (chunked, length) {
            (Some(chunked), length) => {
                // Both framings at once (RFC 9112 §6.3): the transfer coding wins, the length
                // is not passed on as if it were the body's, and the connection is not trusted
                // with another exchange.
                if length.is_some() {
                    headers.remove(CONTENT_LENGTH);
                    close = true;
                }
                if chunked {
                    Framing::Chunked
                } else {
                    close = true;
                    Framing::Close
                }
            }
            (None, None) => {
                close = true;
                Framing::Close
            }
            (None, Some(0)) => Framing::Empty,
            (None, Some(n)) => Framing::Length(n),
        }
    };
    Ok(Some(AnswerHead {
        status,
        version: if minor == 0 {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        },
        headers,
        framing,
        keep_alive: !close,
    }))
}

/// A `Content-Length` value: digits, or a list of the same number repeated.
fn content_length(value: &[u8]) -> Result<u64, io::Error> {
    let mut length = None;
    for item in value.split(|&b| b == b',') {
        let item = item.trim_ascii();
        if item.is_empty() || item.len() > 19 || !item.iter().all(u8::is_ascii_digit) {
            return Err(invalid("a Content-Length is not a number"));
        }
        let n = item.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
        if length.is_some_and(|l| l != n) {
            return Err(invalid("a Content-Length lists different numbers"));
        }
        length = Some(n);
    }
    length.ok_or_else(|| invalid("a Content-Length is empty"))
}

fn invalid(why: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(wire: &[u8], head_request: bool) -> (AnswerHead, BytesMut) {
        let mut buf = BytesMut::from(wire);
        let head = parse_head(&mut buf, head_request).unwrap().unwrap();
        (head, buf)
    }

    #[test]
    fn the_head_says_how_the_body_is_framed_and_whether_the_connection_stays() {
        let (h, rest) = parse(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\nokNEXT",
            false,
        );
        assert_eq!(h.status, 200);
        assert_eq!((h.framing, h.keep_alive), (Framing::Length(2), true));
        assert_eq!(h.headers["x-a"], "b");
        assert_eq!(&rest[..], b"okNEXT");

        let cases: &[(&[u8], bool, Framing, bool)] = &[
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                false,
                Framing::Chunked,
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
                false,
                Framing::Chunked,
                false,
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
                false,
                Framing::Close,
                false,
            ),
            (b"HTTP/1.1 200 OK\r\n\r\n", false, Framing::Close, false),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
                false,
                Framing::Empty,
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n",
                true,
                Framing::Empty,
                true,
            ),
            (
                b"HTTP/1.1 204 No Content\r\n\r\n",
                false,
                Framing::Empty,
                true,
            ),
            (
                b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
                false,
                Framing::Empty,
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 1\r\n\r\n",
                false,
                Framing::Length(1),
                false,
            ),
            (
                b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n",
                false,
                Framing::Length(1),
                false,
            ),
            (
                b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n",
                false,
                Framing::Length(1),
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 4, 4\r\n\r\n",
                false,
                Framing::Length(4),
                true,
            ),
        ];
        for (wire, head_request, framing, keep_alive) in cases {
            let (h, _) = parse(wire, *head_request);
            assert_eq!(
                (h.framing, h.keep_alive),
                (*framing, *keep_alive),
                "{}",
                String::from_utf8_lossy(wire)
            );
        }
    }

    /// A head with more fields than fit on the stack keeps every one, in order.
    #[test]
    fn a_head_with_many_fields_keeps_them_all() {
        let mut wire = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..INLINE_FIELDS + 5 {
            wire.extend_from_slice(format!("X-F{i}: v{i}\r\n").as_bytes());
        }
        wire.extend_from_slice(b"Content-Length: 2\r\nDATE: d\r\n\r\nok");
        let (h, rest) = parse(&wire, false);
        assert_eq!(h.headers.len(), INLINE_FIELDS + 7);
        for i in 0..INLINE_FIELDS + 5 {
            assert_eq!(
                h.headers[format!("x-f{i}").as_str()],
                format!("v{i}").as_str()
            );
        }
        assert_eq!(h.headers[http::header::DATE], "d");
        assert_eq!(h.framing, Framing::Length(2));
        assert_eq!(&rest[..], b"ok");
    }

    #[test]
    fn a_partial_head_waits_and_a_broken_one_is_refused() {
        let (both, _) = parse(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            false,
        );
        assert!(
            !both.headers.contains_key(CONTENT_LENGTH),
            "the length is not the body's"
        );

        let mut partial = BytesMut::from(&b"HTTP/1.1 200 OK\r\nContent-Le"[..]);
        assert!(parse_head(&mut partial, false).unwrap().is_none());
        assert_eq!(partial.len(), 27, "nothing taken");
        for wire in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 4, 5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
            b"SSH-2.0-OpenSSH\r\n\r\n",
        ] {
            let mut buf = BytesMut::from(wire);
            assert!(
                parse_head(&mut buf, false).is_err(),
                "{}",
                String::from_utf8_lossy(wire)
            );
        }
    }

    #[test]
    fn the_request_head_is_origin_form_with_the_body_framed_by_its_length() {
        let request = http::Request::post("http://client.example/a/b?x=1")
            .header("host", "up")
            .header("content-length", "99")
            .header("x-many", "1")
            .header("x-many", "2")
            .body(())
            .unwrap();
        let (mut parts, ()) = request.into_parts();
        parts.uri = "/a/b?x=1".parse().unwrap();
        let mut out = Vec::new();
        write_head(&mut out, &parts, Some(&Bytes::from_static(b"{}")));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /a/b?x=1 HTTP/1.1\r\nhost: up\r\nx-many: 1\r\nx-many: 2\r\ncontent-length: 2\r\n\r\n{}"
        );
        let mut out = Vec::new();
        write_head(&mut out, &parts, None);
        assert!(
            String::from_utf8(out)
                .unwrap()
                .ends_with("content-length: 99\r\nx-many: 1\r\nx-many: 2\r\n\r\n")
        );
    }
}
