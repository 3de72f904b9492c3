//! The server side of an HTTP/1.1 connection for the requests that make up nearly all of a rate
//! limiter's and a gateway's traffic, served without hyper; every other request, and h2, by
//! hyper, on the same connection.
//!
//! hyper's server spends, for one small request, about as many instructions reading and
//! dispatching it as Sluice spends deciding it (a `/json` answer is 18,000 instructions, hyper's
//! part about 6,000; the gateway's server side about 12,000 of 27,000). This connection reads a
//! request head with `httparse`, builds the request from slices of the bytes read (no copy of
//! a field's value), calls the listener's service on the connection's own task, and writes the
//! answer's head and body into one buffer sent with one `write`.
//!
//! What it promises:
//! - **It serves only what it serves exactly as hyper would.** An HTTP/1.1 request with no
//!   body or a body framed by `Content-Length` of at most [`MAX_BODY`], whose head fits in
//!   [`MAX_HEAD`], is served here. Anything else (h2's preface, HTTP/1.0, a chunked or larger
//!   body, `Expect`, `Upgrade`, `HEAD`, `CONNECT`, a head hyper would refuse) is handed to
//!   hyper with every byte read so far ([`Rewind`]), and hyper serves the connection from that
//!   request on, so its answers (a 400, a 431, `100 Continue`) are hyper's own.
//! - **Answers are framed as hyper frames them**: by the answer's `Content-Length` field, else
//!   by its body's exact size, else chunked; none for 204 and 304; `Date` added; `Connection:
//!   close` when the request asked for it or the connection is closing, and the connection then
//!   closed after the answer.
//! - **The connection's deadlines hold as under hyper** ([`connection_deadlines`]): a request
//!   is in flight from its head (the listener's service tells the connection's activity), a
//!   graceful close ends a connection waiting for a head at once and one answering after its
//!   answer, and a client that closes its side while its request is being answered has its
//!   answer dropped, as hyper does.
//! - **A body is read whole before the service is called**, so a body that trickles in is
//!   bounded by the head deadline (and the time a closing connection is given after it): the
//!   request is not in flight until it is whole. A connection closed gracefully meanwhile (the
//!   listener stopping) reads it to its end and answers it.
//!
//! [`connection_deadlines`]: crate::connection_deadlines

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{
    ACCEPT, CACHE_CONTROL, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, DATE, EXPECT, HOST,
    HeaderName, HeaderValue, InvalidHeaderName, SERVER, TRANSFER_ENCODING, UPGRADE, USER_AGENT,
};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::connection_deadlines::Graceful;
use crate::request_body::RequestBody;
use crate::serve::ResponseBody;

/// The most fields a head served here may have; one with more goes to hyper (whose limit,
/// 100, is the same, and which answers 431).
const MAX_FIELDS: usize = 100;
/// The longest head served here; a longer one goes to hyper.
pub const MAX_HEAD: usize = 16 * 1024;
/// The longest body served here; a longer one goes to hyper, which streams it.
pub const MAX_BODY: usize = 64 * 1024;
/// How much room a read is given at least.
const READ_SIZE: usize = 8 * 1024;
/// How much of an answer is gathered before it is written.
const WRITE_SIZE: usize = 64 * 1024;

/// What a connection's errors are.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project_lite::pin_project! {
    /// One HTTP/1.1 connection being served ([`serve`]); asked to close with
    /// [`Graceful::close_gracefully`].
    pub struct H1Connection<F> {
        #[pin]
        serving: F,
        closing: Arc<AtomicBool>,
    }
}

impl<F: Future> Future for H1Connection<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project().serving.poll(cx)
    }
}

impl<F: Future> Graceful for H1Connection<F> {
    /// Seen at the connection's next poll, which follows at once: waiting for a head, it ends;
    /// answering, it ends after the answer (which says `Connection: close`); handed to hyper,
    /// hyper is told.
    fn close_gracefully(self: Pin<&mut Self>) {
        self.closing.store(true, Ordering::Release);
    }
}

/// What a connection answers each request with: the listener's service, wrapped so that the
/// connection's activity sees each request. Any closure of that shape is one.
pub trait Answer: Clone + Send + 'static {
    /// The answers' body.
    type Body: ResponseBody;
    /// An answer in the making.
    type Answering: Future<Output = Result<Response<Self::Body>, Infallible>> + Send + 'static;

    /// Begins answering `request`.
    fn answer(&self, request: Request<RequestBody>) -> Self::Answering;
}

impl<F, Fut, B> Answer for F
where
    F: Fn(Request<RequestBody>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: ResponseBody,
{
    type Body = B;
    type Answering = Fut;

    fn answer(&self, request: Request<RequestBody>) -> Fut {
        self(request)
    }
}

/// Which requests are handed to the service with their header fields.
///
/// A service's endpoints that read only the body (the service's decision endpoints) are spared
/// the field map: building it and dropping it is about 1,500 instructions of a `/json` answer's
/// 14,700, a tenth of it, for three fields that are never looked at. The connection reads every
/// field itself still (framing, `Connection`), and hyper's requests always carry theirs.
#[derive(Debug, Clone, Copy)]
pub enum Fields {
    /// Every request carries its fields.
    All,
    /// A request for which this says true (given its method and its path, without the query)
    /// carries none: its map is empty.
    UnreadFor(fn(&Method, &[u8]) -> bool),
}

impl Fields {
    /// Whether a request for `method` and `target` (path and query) is handed over without its
    /// fields.
    fn unread(self, method: &Method, target: &[u8]) -> bool {
        match self {
            Fields::All => false,
            Fields::UnreadFor(unread) => {
                let path = target.split(|&b| b == b'?').next().unwrap_or(target);
                unread(method, path)
            }
        }
    }
}

/// Serves `io`, an accepted connection, answering each request with `answer`; requests this
/// connection does not serve itself, and the rest of their connection, go to `hyper`.
pub fn serve<I, A>(
    io: I,
    answer: A,
    fields: Fields,
    hyper: Arc<Builder<TokioExecutor>>,
) -> H1Connection<impl Future<Output = Result<(), BoxError>> + Send>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    A: Answer,
{
    let closing = Arc::new(AtomicBool::new(false));
    H1Connection {
        serving: serving(
            io,
            With {
                answer,
                fields,
                hyper,
                closing: Arc::clone(&closing),
            },
        ),
        closing,
    }
}

/// What a connection is served with besides its socket.
struct With<A> {
    answer: A,
    /// Which requests carry their fields.
    fields: Fields,
    /// Who serves what this connection does not.
    hyper: Arc<Builder<TokioExecutor>>,
    /// Set when the connection is asked to close gracefully.
    closing: Arc<AtomicBool>,
}

async fn serving<I, A>(mut io: I, with: With<A>) -> Result<(), BoxError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    A: Answer,
{
    let closing = Arc::clone(&with.closing);
    let mut buf = BytesMut::with_capacity(READ_SIZE);
    let mut out = Vec::with_capacity(READ_SIZE);
    loop {
        let (request, mut close) = loop {
            let mut head_read = false;
            if !buf.is_empty() {
                match parse_request(&mut buf, with.fields) {
                    Parsed::Request(request, close) => break (request, close),
                    Parsed::Partial => {}
                    Parsed::Body => head_read = true,
                    Parsed::Elsewhere => return by_hyper(io, buf, with).await,
                }
            }
            // Waiting for a head (or the rest of one): a graceful close ends the connection,
            // as hyper's does, since nothing of it has been answered. A request whose head
            // has come is read to its end and answered, as hyper answers a request it has
            // begun; the connection's deadlines bound how long its body may take.
            let read = poll_fn(|cx| {
                if !head_read && closing.load(Ordering::Acquire) {
                    return Poll::Ready(Ok(0));
                }
                poll_read(&mut io, &mut buf, cx)
            })
            .await?;
            if read == 0 {
                return Ok(());
            }
        };
        let response = {
            let mut answering = std::pin::pin!(with.answer.answer(request));
            // While the answer is made, the socket is read: a client that closes its side has
            // its answer dropped, as under hyper (which does not serve half-closed
            // connections); what a pipelining client sends meanwhile is kept for later.
            let answered = poll_fn(|cx| {
                if let Poll::Ready(answered) = answering.as_mut().poll(cx) {
                    return Poll::Ready(Some(answered));
                }
                if poll_closed(&mut io, &mut buf, cx) {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await;
            match answered {
                Some(Ok(response)) => response,
                Some(Err(never)) => match never {},
                None => return Ok(()),
            }
        };
        if !write_answer(&mut io, &mut buf, &mut out, response, &mut close, &closing).await? {
            return Ok(());
        }
        if close || closing.load(Ordering::Acquire) {
            let _ = io.shutdown().await;
            return Ok(());
        }
        // A large answer or pipelined burst leaves its buffers large: a kept-alive connection
        // holds only what a usual request needs while it waits for the next.
        if out.capacity() > WRITE_SIZE * 2 {
            out = Vec::with_capacity(READ_SIZE);
        }
        if buf.is_empty() && buf.capacity() > READ_SIZE * 4 {
            buf = BytesMut::with_capacity(READ_SIZE);
        }
    }
}

/// Serves the rest of the connection with hyper, from the bytes read so far.
async fn by_hyper<I, A>(io: I, read: BytesMut, with: With<A>) -> Result<(), BoxError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    A: Answer,
{
    let With {
        answer,
        hyper,
        closing,
        ..
    } = with;
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        answer.answer(request.map(RequestBody::from))
    });
    let connection = hyper
        .serve_connection(TokioIo::new(Rewind::new(read.freeze(), io)), service)
        .into_owned();
    let mut connection = std::pin::pin!(connection);
    let mut told = false;
    poll_fn(|cx| {
        if !told && closing.load(Ordering::Acquire) {
            told = true;
            connection.as_mut().graceful_shutdown();
        }
        connection.as_mut().poll(cx)
    })
    .await
}

/// What the front of the bytes read holds.
// Returned and taken apart at once: boxing the request would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Parsed {
    /// A request served here, and whether the connection closes after it.
    Request(Request<RequestBody>, bool),
    /// Not all of a request's head yet.
    Partial,
    /// A whole head, and not all of its body yet.
    Body,
    /// A request hyper serves.
    Elsewhere,
}

/// The field names most heads carry, each with its text, by which [`field_name`] knows them;
/// in order of length, as [`field_name`] picks them by it.
static COMMON_NAMES: [(&str, HeaderName); 10] = [
    ("date", DATE),
    ("host", HOST),
    ("accept", ACCEPT),
    ("server", SERVER),
    ("connection", CONNECTION),
    ("user-agent", USER_AGENT),
    ("content-type", CONTENT_TYPE),
    ("cache-control", CACHE_CONTROL),
    ("content-length", CONTENT_LENGTH),
    ("transfer-encoding", TRANSFER_ENCODING),
];

/// The field name `name`, as `HeaderName::from_bytes` makes it. The common names are told by
/// their length and then their letters, a few instructions where the general lookup lowercases
/// the name into a buffer and matches it against every standard name (about a hundred
/// instructions a field, and a head has two or three).
pub fn field_name(name: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
    let candidates = match name.len() {
        4 => &COMMON_NAMES[0..2],
        6 => &COMMON_NAMES[2..4],
        10 => &COMMON_NAMES[4..6],
        12 => &COMMON_NAMES[6..7],
        13 => &COMMON_NAMES[7..8],
        14 => &COMMON_NAMES[8..9],
        17 => &COMMON_NAMES[9..10],
        _ => &[],
    };
    for (text, known) in candidates {
        if folded_eq(name, text.as_bytes()) {
            return Ok(known.clone());
        }
    }
    HeaderName::from_bytes(name)
}

/// Whether `name` is `lower` (a lowercase text of the same length, 4 bytes or more) but for
/// the case of its ASCII letters: eight bytes at a time, where comparing a byte at a time, each
/// lowercased, costs several instructions a byte.
fn folded_eq(name: &[u8], lower: &[u8]) -> bool {
    let n = name.len();
    if n != lower.len() || n < 4 {
        return name.eq_ignore_ascii_case(lower);
    }
    if n < 8 {
        // Two words of four, overlapping when the text is shorter than eight.
        let pair = |b: &[u8]| u64::from(le32(b, 0)) | u64::from(le32(b, n - 4)) << 32;
        return lowercase(pair(name)) == pair(lower);
    }
    let mut at = 0;
    while at + 8 < n {
        if lowercase(le64(name, at)) != le64(lower, at) {
            return false;
        }
        at += 8;
    }
    // The last eight, overlapping what was compared when the length is not a multiple.
    lowercase(le64(name, n - 8)) == le64(lower, n - 8)
}

/// The eight bytes at `at` (which the caller keeps within `b`) as one word.
fn le64(b: &[u8], at: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The four bytes at `at` (which the caller keeps within `b`) as one word.
fn le32(b: &[u8], at: usize) -> u32 {
    let mut w = [0; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

/// `w` with each of its bytes that is an ASCII capital made lowercase, and every other byte as
/// it was: a byte's low seven bits are compared with `A` and `Z` by adding to them, so no
/// carry crosses into the next byte, and a byte with its top bit set is no letter.
fn lowercase(w: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const TOP: u64 = 0x8080_8080_8080_8080;
    let seven = w & LOW7;
    let from_a = seven + 0x3f3f_3f3f_3f3f_3f3f; // top bit set when the byte is `A` or above
    let past_z = seven + 0x2525_2525_2525_2525; // top bit set when the byte is above `Z`
    let capital = from_a & !past_z & !w & TOP;
    w | (capital >> 2)
}

/// How many fields' places a head keeps on the stack; one with more takes a vector. Most heads
/// have a handful, and the array is cleared for every head.
pub const INLINE_FIELDS: usize = 16;

/// Room for the places of a head's `n` fields: `inline`, on the stack, when they fit, else
/// `spilled`, grown to hold them.
pub fn field_places<'a, T: Copy + Default>(
    inline: &'a mut [T; INLINE_FIELDS],
    spilled: &'a mut Vec<T>,
    n: usize,
) -> &'a mut [T] {
    if n <= INLINE_FIELDS {
        &mut inline[..n]
    } else {
        spilled.resize(n, T::default());
        spilled
    }
}

/// Where a field lies in the head.
#[derive(Debug, Default, Clone, Copy)]
struct FieldAt {
    name: u16,
    name_len: u16,
    value: u16,
    value_len: u16,
}

/// Takes the request at the front of `buf` off it when it is served here and whole, with its
/// fields unless `fields` says they are unread; leaves `buf` as it was otherwise.
fn parse_request(buf: &mut BytesMut, fields: Fields) -> Parsed {
    let mut storage = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
    let mut inline = [FieldAt::default(); INLINE_FIELDS];
    let mut spilled = Vec::new();
    let base = buf.as_ptr() as usize;
    let offset = |p: *const u8| (p as usize - base) as u16;
    let (head_len, method, target, at, body_len, close) = {
        let mut request = httparse::Request::new(&mut []);
        let head_len = match request.parse_with_uninit_headers(buf, &mut storage) {
            Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD => len,
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Parsed::Partial,
            _ => return Parsed::Elsewhere,
        };
        if request.version != Some(1) {
            return Parsed::Elsewhere;
        }
        let method = match request.method.map(str::as_bytes) {
            Some(b"GET") => Method::GET,
            Some(b"POST") => Method::POST,
            Some(b"PUT") => Method::PUT,
            Some(b"DELETE") => Method::DELETE,
            Some(b"PATCH") => Method::PATCH,
            Some(b"OPTIONS") => Method::OPTIONS,
            _ => return Parsed::Elsewhere,
        };
        let Some(path) = request.path else {
            return Parsed::Elsewhere;
        };
        let target = offset(path.as_ptr())..offset(path.as_ptr()) + path.len() as u16;
        let mut length: Option<usize> = None;
        let mut close = false;
        let at = field_places(&mut inline, &mut spilled, request.headers.len());
        for (field, at) in request.headers.iter().zip(at.iter_mut()) {
            *at = FieldAt {
                name: offset(field.name.as_ptr()),
                name_len: field.name.len() as u16,
                value: offset(field.value.as_ptr()),
                value_len: field.value.len() as u16,
            };
            let name = field.name.as_bytes();
            if name.eq_ignore_ascii_case(b"content-length") {
                let Some(n) = content_length(field.value) else {
                    return Parsed::Elsewhere;
                };
                if length.is_some_and(|l| l != n) {
                    return Parsed::Elsewhere;
                }
                length = Some(n);
            } else if name.eq_ignore_ascii_case(b"connection") {
                for token in field.value.split(|&b| b == b',') {
                    let token = token.trim_ascii();
                    if token.eq_ignore_ascii_case(b"close") {
                        close = true;
                    } else if token.eq_ignore_ascii_case(b"upgrade") {
                        return Parsed::Elsewhere;
                    }
                }
            } else if name.eq_ignore_ascii_case(TRANSFER_ENCODING.as_str().as_bytes())
                || name.eq_ignore_ascii_case(EXPECT.as_str().as_bytes())
                || name.eq_ignore_ascii_case(UPGRADE.as_str().as_bytes())
            {
                return Parsed::Elsewhere;
            }
        }
        let body_len = length.unwrap_or(0);
        if body_len > MAX_BODY {
            return Parsed::Elsewhere;
        }
        (head_len, method, target, at, body_len, close)
    };
    if buf.len() < head_len + body_len {
        return Parsed::Body;
    }
    let target_bytes = &buf[target.start as usize..target.end as usize];
    if target_bytes.first() != Some(&b'/') {
        // Absolute and asterisk forms: rare from clients of an origin server; hyper's.
        return Parsed::Elsewhere;
    }
    let head = buf.split_to(head_len).freeze();
    let body = buf.split_to(body_len).freeze();
    let Ok(uri) = Uri::from_maybe_shared(head.slice(target.start as usize..target.end as usize))
    else {
        return restore(buf, head, body);
    };
    let count = if fields.unread(&method, &head[target.start as usize..target.end as usize]) {
        0
    } else {
        at.len()
    };
    // `httparse` accepts only names and values that `http` accepts too; should they ever
    // differ, the request is hyper's, which answers it itself.
    // Room for the fields a proxy adds (`X-Forwarded-For`), so that adding them does not grow
    // the map; none for a request whose fields are unread.
    let mut headers = if count == 0 {
        HeaderMap::new()
    } else {
        HeaderMap::with_capacity(count + 2)
    };
    for at in &at[..count] {
        let name = field_name(&head[at.name as usize..(at.name + at.name_len) as usize]);
        let value = HeaderValue::from_maybe_shared(
            head.slice(at.value as usize..(at.value + at.value_len) as usize),
        );
        let (Ok(name), Ok(value)) = (name, value) else {
            return restore(buf, head, body);
        };
        headers.append(name, value);
    }
    let mut request = Request::new(RequestBody::whole(body));
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    Parsed::Request(request, close)
}

/// Puts a request's bytes, taken off `buf`, back in front of it, for hyper: for what
/// `httparse` accepts and `http` refuses, which hyper answers itself.
fn restore(buf: &mut BytesMut, head: Bytes, body: Bytes) -> Parsed {
    let mut again = BytesMut::with_capacity(head.len() + body.len() + buf.len());
    again.extend_from_slice(&head);
    again.extend_from_slice(&body);
    again.extend_from_slice(buf);
    *buf = again;
    Parsed::Elsewhere
}

/// A `Content-Length` value: digits only, as RFC 9110 §8.6 has it.
fn content_length(value: &[u8]) -> Option<usize> {
    if value.is_empty() || value.len() > 18 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(value.iter().fold(0, |n, d| n * 10 + usize::from(d - b'0')))
}

/// Whether the client has closed the connection (or it failed), as seen by reading what it
/// sent meanwhile into `buf` (a pipelining client's next requests); while `buf` is full, not
/// looked at.
fn poll_closed<I: AsyncRead + Unpin>(io: &mut I, buf: &mut BytesMut, cx: &mut Context<'_>) -> bool {
    while buf.len() < MAX_HEAD + MAX_BODY {
        match poll_read(io, buf, cx) {
            Poll::Ready(Ok(0) | Err(_)) => return true,
            Poll::Ready(Ok(_)) => {}
            Poll::Pending => break,
        }
    }
    false
}

/// Reads what `io` has into `buf`: how many bytes, 0 at the connection's end.
fn poll_read<I: AsyncRead + Unpin>(
    io: &mut I,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    if buf.capacity() - buf.len() < READ_SIZE / 4 {
        buf.reserve(READ_SIZE);
    }
    tokio_util::io::poll_read_buf(Pin::new(io), cx, buf)
}

/// How an answer's body is framed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body (204, 304).
    Empty,
    /// This many bytes.
    Length(u64),
    /// Chunked.
    Chunked,
    /// Until the connection closes (an answer that says it is transfer-coded, not chunked).
    UntilClose,
}

/// Writes `response`, its head and all of its body, gathering what is ready into `out` and
/// writing it when its body has nothing more ready or it has grown large. `false` when the
/// client closed the connection while the body was waited for: the answer is dropped, as
/// under hyper.
async fn write_answer<I, B>(
    io: &mut I,
    buf: &mut BytesMut,
    out: &mut Vec<u8>,
    response: Response<B>,
    close: &mut bool,
    closing: &AtomicBool,
) -> Result<bool, BoxError>
where
    I: AsyncRead + AsyncWrite + Unpin,
    B: ResponseBody,
{
    let (parts, body) = response.into_parts();
    let mut body = std::pin::pin!(body);
    if parts.status.is_informational() {
        return Err("an informational answer cannot end a request".into());
    }
    let fields = AnswerFields::of(&parts.headers);
    let (framing, added) = framing(&fields, parts.status, body.size_hint().exact());
    *close |= fields.close || framing == Framing::UntilClose;
    let say_close = (*close || closing.load(Ordering::Acquire)) && !fields.connection;
    out.clear();
    write_head(out, &parts, &fields, added, say_close);
    if framing == Framing::Empty {
        write_all(io, out).await?;
        return Ok(true);
    }
    let mut left = match framing {
        Framing::Length(n) => n,
        _ => u64::MAX,
    };
    loop {
        let mut frame = poll_fn(|cx| Poll::Ready(poll_frame(body.as_mut(), cx))).await;
        if frame.is_pending() {
            // Nothing more ready: what is gathered goes out while the body is waited for.
            write_all(io, out).await?;
            out.clear();
            let waited = poll_fn(|cx| {
                if let Poll::Ready(frame) = poll_frame(body.as_mut(), cx) {
                    return Poll::Ready(Some(frame));
                }
                if poll_closed(io, buf, cx) {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await;
            let Some(waited) = waited else {
                return Ok(false);
            };
            frame = Poll::Ready(waited);
        }
        let Poll::Ready(frame) = frame else {
            continue;
        };
        match frame {
            None => break,
            Some(Err(e)) => return Err(e),
            Some(Ok(frame)) => {
                let Ok(mut data) = frame.into_data() else {
                    // Trailers: HTTP/1.1 sends them only when the client said it takes them,
                    // which this connection does not ask.
                    continue;
                };
                let len = data.remaining();
                if len == 0 {
                    continue;
                }
                if len as u64 > left {
                    return Err("the answer's body is longer than its Content-Length".into());
                }
                if framing == Framing::Chunked {
                    let mut hex = [0u8; 16];
                    out.extend_from_slice(hex_len(len, &mut hex));
                    out.extend_from_slice(b"\r\n");
                }
                if let Framing::Length(_) = framing {
                    left -= len as u64;
                }
                // A small part is gathered; a large one (a download) is written from where it
                // is, after what was gathered, so that neither is copied twice nor makes the
                // connection's buffer grow to its size.
                let large = len >= WRITE_SIZE;
                if large {
                    write_all(io, out).await?;
                    out.clear();
                }
                while data.has_remaining() {
                    let chunk = data.chunk();
                    if large {
                        write_all(io, chunk).await?;
                    } else {
                        out.extend_from_slice(chunk);
                    }
                    let n = chunk.len();
                    data.advance(n);
                }
                if framing == Framing::Chunked {
                    out.extend_from_slice(b"\r\n");
                }
                if out.len() >= WRITE_SIZE {
                    write_all(io, out).await?;
                    out.clear();
                }
            }
        }
    }
    match framing {
        Framing::Length(_) if left != 0 => {
            write_all(io, out).await?;
            return Err("the answer's body ended before its Content-Length".into());
        }
        Framing::Chunked => out.extend_from_slice(b"0\r\n\r\n"),
        _ => {}
    }
    write_all(io, out).await?;
    Ok(true)
}

/// The next frame of an answer's body, its error boxed.
fn poll_frame<B: ResponseBody>(
    body: Pin<&mut B>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<http_body::Frame<B::Data>, BoxError>>> {
    body.poll_frame(cx)
        .map(|frame| frame.map(|f| f.map_err(Into::into)))
}

/// What an answer's own fields say about its framing and its connection, found in one pass.
#[derive(Debug, Default)]
struct AnswerFields {
    /// `Content-Length`, when there is one: its value, `None` when it is not a length.
    length: Option<Option<u64>>,
    /// `Transfer-Encoding`, when there is one: whether its last coding is chunked.
    chunked: Option<bool>,
    /// Whether there is a `Connection` field.
    connection: bool,
    /// Whether it says `close`.
    close: bool,
    /// Whether there is a `Date` field.
    date: bool,
}

impl AnswerFields {
    fn of(headers: &HeaderMap) -> AnswerFields {
        let mut fields = AnswerFields::default();
        for (name, value) in headers {
            if *name == CONTENT_LENGTH {
                fields.length = Some(content_length(value.as_bytes()).map(|n| n as u64));
            } else if *name == TRANSFER_ENCODING {
                fields.chunked = Some(
                    value
                        .as_bytes()
                        .rsplit(|&b| b == b',')
                        .next()
                        .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked")),
                );
            } else if *name == CONNECTION {
                fields.connection = true;
                fields.close |= value
                    .as_bytes()
                    .split(|&b| b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
            } else if *name == DATE {
                fields.date = true;
            }
        }
        fields
    }
}

/// The framing field the connection adds to an answer's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Added {
    None,
    Length(u64),
    Chunked,
}

/// How an answer with `fields` and `status`, whose body is `exact` bytes when known, is
/// framed, and which framing field is added to its own: its `Content-Length` or
/// `Transfer-Encoding` when valid (the coding wins over a length), else its body's exact
/// length, else chunks; none for 204 and 304.
fn framing(fields: &AnswerFields, status: StatusCode, exact: Option<u64>) -> (Framing, Added) {
    if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return (Framing::Empty, Added::None);
    }
    match (fields.chunked, fields.length) {
        (Some(true), _) => (Framing::Chunked, Added::None),
        (Some(false), _) => (Framing::UntilClose, Added::None),
        (None, Some(Some(n))) => (Framing::Length(n), Added::None),
        _ => match exact {
            Some(n) => (Framing::Length(n), Added::Length(n)),
            None => (Framing::Chunked, Added::Chunked),
        },
    }
}

/// The status line, the answer's fields (less those its framing overrides), the framing field
/// `added`, `Date` when the answer has none, and `Connection: close` when `close`.
fn write_head(
    out: &mut Vec<u8>,
    parts: &http::response::Parts,
    fields: &AnswerFields,
    added: Added,
    close: bool,
) {
    let status = parts.status;
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let no_body = status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    // A length beside a coding, or one that is not a length, is not sent: the body is framed
    // otherwise (RFC 9112 §6.3). 204 has neither field, 304 keeps its length (the one of what
    // a 200 would have sent).
    let skip_length =
        fields.chunked.is_some() || fields.length == Some(None) || status == StatusCode::NO_CONTENT;
    for (name, value) in &parts.headers {
        if (*name == CONTENT_LENGTH && skip_length) || (*name == TRANSFER_ENCODING && no_body) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match added {
        Added::None => {}
        Added::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Added::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    if !fields.date {
        out.extend_from_slice(b"date: ");
        crate::http_date::now(out);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// `len` in hexadecimal, as a chunk's size line has it.
fn hex_len(len: usize, buf: &mut [u8; 16]) -> &[u8] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut n = len;
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = DIGITS[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    &buf[at..]
}

/// Writes all of `out`.
async fn write_all<I: AsyncWrite + Unpin>(io: &mut I, out: &[u8]) -> Result<(), BoxError> {
    let mut written = 0;
    while written < out.len() {
        let n = poll_fn(|cx| Pin::new(&mut *io).poll_write(cx, &out[written..])).await?;
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero).into());
        }
        written += n;
    }
    Ok(())
}

pin_project_lite::pin_project! {
    /// A connection whose first bytes, already read, are read again: hyper takes over a
    /// connection from where this one's reading began.
    #[derive(Debug)]
    pub struct Rewind<I> {
        read: Bytes,
        #[pin]
        io: I,
    }
}

impl<I> Rewind<I> {
    /// `io`, whose reads give `read` first.
    pub fn new(read: Bytes, io: I) -> Self {
        Rewind { read, io }
    }
}

impl<I: AsyncRead> AsyncRead for Rewind<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if !this.read.is_empty() {
            let n = this.read.len().min(buf.remaining());
            buf.put_slice(&this.read.split_to(n));
            return Poll::Ready(Ok(()));
        }
        this.io.poll_read(cx, buf)
    }
}

impl<I: AsyncWrite> AsyncWrite for Rewind<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().io.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().io.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(wire: &[u8]) -> (Parsed, BytesMut) {
        let mut buf = BytesMut::from(wire);
        (parse_request(&mut buf, Fields::All), buf)
    }

    #[test]
    fn the_common_names_are_their_texts_in_order_of_length() {
        for (text, name) in &COMMON_NAMES {
            assert_eq!(name.as_str(), *text);
        }
        assert!(COMMON_NAMES.is_sorted_by_key(|(text, _)| text.len()));
    }

    proptest::proptest! {
        /// Lowercasing a word lowercases each of its bytes as ASCII does, whatever they are.
        #[test]
        fn a_word_is_lowercased_byte_by_byte(bytes in proptest::array::uniform8(proptest::num::u8::ANY)) {
            let each = bytes.map(|b| b.to_ascii_lowercase());
            proptest::prop_assert_eq!(lowercase(u64::from_le_bytes(bytes)), u64::from_le_bytes(each));
        }

        /// The common names are known as the general lookup knows them, in any case, and
        /// anything else goes to it: the two never differ.
        #[test]
        fn field_names_are_what_the_general_lookup_makes(
            common in 0..COMMON_NAMES.len(),
            capitals in proptest::collection::vec(proptest::bool::ANY, 17),
            flip in 0..17usize,
            other in proptest::collection::vec(proptest::num::u8::ANY, 0..20),
        ) {
            let text = COMMON_NAMES[common].0.as_bytes();
            let cased: Vec<u8> = text
                .iter()
                .zip(&capitals)
                .map(|(&b, &up)| if up { b.to_ascii_uppercase() } else { b })
                .collect();
            // One byte off by bit 5, or by another bit: a different name, or none.
            let mut near = cased.clone();
            let i = flip % near.len();
            near[i] ^= if flip % 2 == 0 { 0x20 } else { 0x01 };
            for name in [&cased, &near, &other] {
                let fast = field_name(name).map_err(|_| ());
                let general = HeaderName::from_bytes(name).map_err(|_| ());
                proptest::prop_assert_eq!(fast, general, "{:?}", name);
            }
        }
    }

    #[test]
    fn a_simple_request_is_served_here_with_its_fields_and_body() {
        let wire = b"POST /json?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nX-Two: 1\r\nx-two: 2\r\n\r\nhelloGET /next";
        let (parsed, rest) = parse(wire);
        let Parsed::Request(request, close) = parsed else {
            panic!("{parsed:?}");
        };
        assert!(!close);
        assert_eq!(request.method(), Method::POST);
        assert_eq!(request.uri().path(), "/json");
        assert_eq!(request.uri().query(), Some("x=1"));
        assert_eq!(request.version(), Version::HTTP_11);
        assert_eq!(request.headers()["host"], "a");
        let twos: Vec<_> = request.headers().get_all("x-two").iter().collect();
        assert_eq!(twos, ["1", "2"]);
        assert_eq!(
            request.body().as_whole().map(|b| &b[..]),
            Some(&b"hello"[..])
        );
        assert_eq!(&rest[..], b"GET /next", "the next request stays");
    }

    /// A head with more fields than fit on the stack keeps every one, in order.
    #[test]
    fn a_request_with_many_fields_keeps_them_all() {
        let mut wire = b"GET /many HTTP/1.1\r\nHOST: h\r\n".to_vec();
        for i in 0..INLINE_FIELDS + 5 {
            wire.extend_from_slice(format!("X-F{i}: v{i}\r\n").as_bytes());
        }
        wire.extend_from_slice(b"\r\n");
        let (parsed, rest) = parse(&wire);
        let Parsed::Request(request, _) = parsed else {
            panic!("{parsed:?}");
        };
        assert_eq!(request.headers().len(), INLINE_FIELDS + 6);
        assert_eq!(request.headers()[HOST], "h");
        for i in 0..INLINE_FIELDS + 5 {
            let name = format!("x-f{i}");
            assert_eq!(request.headers()[name.as_str()], format!("v{i}").as_str());
        }
        assert!(rest.is_empty());
    }

    #[test]
    fn a_request_whose_fields_are_unread_comes_without_them_and_whole() {
        fn json_only(method: &Method, path: &[u8]) -> bool {
            method == Method::POST && path == b"/json"
        }
        let wire = b"POST /json?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhelloGET /json HTTP/1.1\r\nHost: b\r\n\r\n";
        let mut buf = BytesMut::from(&wire[..]);
        let Parsed::Request(request, close) = parse_request(&mut buf, Fields::UnreadFor(json_only))
        else {
            panic!("served here");
        };
        assert!(request.headers().is_empty(), "{:?}", request.headers());
        assert!(close, "the connection's own fields are still read");
        assert_eq!(request.uri().path_and_query().unwrap(), "/json?x=1");
        assert_eq!(
            request.body().as_whole().map(|b| &b[..]),
            Some(&b"hello"[..])
        );
        // Another method on the same path: its fields are read.
        let Parsed::Request(request, _) = parse_request(&mut buf, Fields::UnreadFor(json_only))
        else {
            panic!("served here");
        };
        assert_eq!(request.headers()["host"], "b");
        assert!(buf.is_empty());
    }

    #[test]
    fn a_request_not_yet_whole_waits_and_leaves_its_bytes() {
        for wire in [&b"GET / HTTP/1.1\r\nHost: a\r\n"[..], b"GET /a HT"] {
            let (parsed, rest) = parse(wire);
            assert!(matches!(parsed, Parsed::Partial), "{parsed:?}");
            assert_eq!(&rest[..], wire);
        }
        let wire = b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nhalf";
        let (parsed, rest) = parse(wire);
        assert!(matches!(parsed, Parsed::Body), "{parsed:?}");
        assert_eq!(&rest[..], wire);
    }

    #[test]
    fn what_hyper_serves_is_left_whole_for_it() {
        let long_field = format!("GET / HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        let big_body = format!(
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        let cases: Vec<&[u8]> = vec![
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            b"GET / HTTP/1.0\r\n\r\n",
            b"HEAD / HTTP/1.1\r\n\r\n",
            b"CONNECT a:443 HTTP/1.1\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\n\r\n",
            b"OPTIONS * HTTP/1.1\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            b"POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\na",
            b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
            b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            b"GET / HTTP/1.1\r\nBad Field: 1\r\n\r\n",
            long_field.as_bytes(),
            big_body.as_bytes(),
        ];
        for wire in cases {
            let (parsed, rest) = parse(wire);
            assert!(
                matches!(parsed, Parsed::Elsewhere),
                "{:?}: {parsed:?}",
                String::from_utf8_lossy(&wire[..wire.len().min(60)])
            );
            assert_eq!(&rest[..], wire, "nothing is taken off");
        }
    }

    #[test]
    fn connection_close_is_seen_among_other_tokens() {
        let (parsed, _) = parse(b"GET / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n");
        assert!(matches!(parsed, Parsed::Request(_, true)), "{parsed:?}");
    }

    fn head(status: u16, fields: &[(&str, &str)], exact: Option<u64>, close: bool) -> String {
        let mut response = Response::builder().status(status);
        for (name, value) in fields {
            response = response.header(*name, *value);
        }
        let (parts, ()) = response.body(()).unwrap().into_parts();
        let found = AnswerFields::of(&parts.headers);
        let (_, added) = framing(&found, parts.status, exact);
        let mut out = Vec::new();
        write_head(&mut out, &parts, &found, added, close && !found.connection);
        let text = String::from_utf8(out).unwrap();
        // The date moves; everything else is fixed.
        let date = text.find("date: ").expect("a date");
        let end = date + text[date..].find("\r\n").unwrap() + 2;
        format!("{}{}", &text[..date], &text[end..])
    }

    #[test]
    fn answers_are_framed_as_their_fields_and_body_say() {
        assert_eq!(
            head(200, &[("x-a", "1")], Some(5), false),
            "HTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 5\r\n\r\n"
        );
        assert_eq!(
            head(200, &[], None, true),
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        );
        // Its own length wins over the body's hint; a coding wins over a length.
        assert_eq!(
            head(200, &[("content-length", "7")], Some(5), false),
            "HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n"
        );
        assert_eq!(
            head(
                200,
                &[
                    ("content-length", "7"),
                    ("transfer-encoding", "gzip, chunked")
                ],
                None,
                false
            ),
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n"
        );
        // 204 has no framing at all; 304 keeps the length of what a 200 would have had.
        assert_eq!(
            head(
                204,
                &[("content-length", "3"), ("transfer-encoding", "chunked")],
                Some(0),
                false
            ),
            "HTTP/1.1 204 No Content\r\n\r\n"
        );
        assert_eq!(
            head(304, &[("content-length", "3")], Some(0), false),
            "HTTP/1.1 304 Not Modified\r\ncontent-length: 3\r\n\r\n"
        );
        // A connection field of the answer's own is not repeated.
        assert_eq!(
            head(200, &[("connection", "close")], Some(0), true),
            "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
        );
        let (framing, _) = framing(
            &AnswerFields::of(
                &Response::builder()
                    .header("transfer-encoding", "gzip")
                    .body(())
                    .unwrap()
                    .into_parts()
                    .0
                    .headers,
            ),
            StatusCode::OK,
            None,
        );
        assert_eq!(framing, Framing::UntilClose);
    }

    #[test]
    fn chunk_sizes_are_hexadecimal() {
        let mut buf = [0u8; 16];
        assert_eq!(hex_len(0, &mut buf), b"0");
        assert_eq!(hex_len(255, &mut buf), b"ff");
        assert_eq!(hex_len(65_536, &mut buf), b"10000");
    }

    #[tokio::test]
    async fn a_rewound_connection_reads_what_was_read_first() {
        use tokio::io::AsyncReadExt;
        let inner: &[u8] = b" world";
        let mut io = Rewind::new(Bytes::from_static(b"hello"), inner);
        let mut all = String::new();
        io.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "hello world");
    }
}
