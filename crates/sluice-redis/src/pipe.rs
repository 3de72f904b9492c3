//! The script calls' own connection to a standalone Redis server over plain TCP.
//!
//! A decision on the Redis store is one `EVALSHA`. Through the `redis` crate's multiplexed
//! connection it cost about 8,000 instructions beyond the script's own work: a `Cmd` built and
//! encoded again into a pipeline, a hop to the connection's driver task and back, and each
//! reply parsed through a general parser into owned values. Here the batch task owns the socket
//! itself: a call arrives already encoded (see [`pack_eval_sha`]), is copied into the write
//! buffer, and its reply is parsed where it was read, in the order the calls were written. The
//! calls that arrive together still go out in one write (see the batch task in
//! `connection.rs`), and each call still has its own deadline.
//!
//! The connection is opened when the first call needs it, and again after it fails: a failure
//! answers the calls waiting on it with the error (a transient one, which the breaker counts),
//! and the next call dials anew. `AUTH` and `SELECT` go first on every connection. A script the
//! server does not know (`NOSCRIPT`, after a restart or `SCRIPT FLUSH`) is sent again as `EVAL`
//! on the same connection. TLS and Sentinel keep the `redis` crate's connection.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use redis::{RedisError, RedisResult, Value};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, Sleep, sleep_until};

use crate::connection::{Call, MAX_BATCH, is_no_script, timed_out};
use crate::scripts::Script;
use crate::url::RedisUrl;

/// Where the pipe connects, and what it says first on every connection.
pub(crate) struct Dial {
    host: String,
    port: u16,
    /// `AUTH` and `SELECT`, packed; empty when neither is needed.
    hello: Vec<u8>,
    /// How many replies `hello` has.
    hello_replies: usize,
    connect_timeout: Duration,
}

impl Dial {
    /// The server `host` with the credentials and database of `url`.
    pub(crate) fn new(
        url: &RedisUrl,
        (host, port): &(String, u16),
        connect_timeout: Duration,
    ) -> Self {
        let mut hello = Vec::new();
        let mut hello_replies = 0;
        if let Some(password) = &url.password {
            let user = url.username.as_deref().map(str::as_bytes);
            let auth = [b"AUTH".as_slice()].into_iter().chain(user);
            hello.extend(pack(auth.chain([password.as_bytes()])));
            hello_replies += 1;
        }
        if url.db != 0 {
            let db = url.db.to_string();
            hello.extend(pack([b"SELECT".as_slice(), db.as_bytes()].into_iter()));
            hello_replies += 1;
        }
        Dial {
            host: host.clone(),
            port: *port,
            hello,
            hello_replies,
            connect_timeout,
        }
    }

    async fn connect(self: Arc<Self>) -> io::Result<Open> {
        // Errors say nothing of where: the store names its target in front of them.
        let connecting = TcpStream::connect((self.host.as_str(), self.port));
        let stream = match tokio::time::timeout(self.connect_timeout, connecting).await {
            Ok(connected) => connected?,
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection within {:?}", self.connect_timeout),
                ));
            }
        };
        stream.set_nodelay(true)?;
        // A second handle on the socket, to look at it without the runtime's readiness.
        let std = stream.into_std()?;
        let probe = std.try_clone()?;
        Ok(Open {
            stream: TcpStream::from_std(std)?,
            probe,
        })
    }
}

/// The batch task of a standalone server over plain TCP: takes the calls queued for it, and
/// answers each with its reply, a timeout at its deadline, or the connection's failure.
pub(crate) async fn run(dial: Arc<Dial>, queue: mpsc::UnboundedReceiver<Call>) {
    let mut pipe = Pipe {
        dial,
        queue: Some(queue),
        yielded: false,
        held: Vec::new(),
        wire: Wire::Idle,
        out: Vec::new(),
        written: 0,
        input: vec![0; READ_CHUNK],
        parsed: 0,
        filled: 0,
        waiting: VecDeque::new(),
        sent: 0,
        evals: Vec::new(),
        timer: Box::pin(sleep_until(Instant::now())),
        timer_at: None,
    };
    std::future::poll_fn(|cx| pipe.poll(cx)).await;
}

/// How much the read buffer takes from the socket at a time, at least.
const READ_CHUNK: usize = 16 * 1024;

type Connecting = Pin<Box<dyn Future<Output = io::Result<Open>> + Send>>;

enum Wire {
    Idle,
    Connecting(Connecting),
    Open(Open),
}

/// A connection, and a second handle on its socket.
struct Open {
    stream: TcpStream,
    /// Peeks at the socket before calls are written to an idle connection: the runtime may
    /// not yet have seen that the server closed it (a server's `timeout`, a proxy's idle
    /// limit, `CLIENT KILL`), and a call written to a closed connection fails, where one held
    /// back a moment goes on a new connection.
    probe: std::net::TcpStream,
}

impl Open {
    /// Whether the server has closed the connection, or sent something, though no reply is due.
    fn closed_while_idle(&self) -> bool {
        match self.probe.peek(&mut [0u8; 1]) {
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
            Ok(_) => true,
        }
    }
}

struct Pipe {
    dial: Arc<Dial>,
    /// `None` once every sender has gone.
    queue: Option<mpsc::UnboundedReceiver<Call>>,
    /// Whether the task has yielded once since calls arrived, so that the calls made by the
    /// tasks ready at the same moment go out together.
    yielded: bool,
    /// Calls taken from the queue and not yet written: waiting for the yield or a connection.
    held: Vec<Call>,
    wire: Wire,
    /// What is to be written to the connection; `written` bytes of it have been.
    out: Vec<u8>,
    written: usize,
    /// Bytes read: `parsed..filled` is what has not been parsed yet.
    input: Vec<u8>,
    parsed: usize,
    filled: usize,
    /// One entry per command written, or in `out`, in order: each reply answers the front.
    waiting: VecDeque<Waiter>,
    /// How many commands have been put in `out`, on every connection: each waiter's `seq`.
    sent: u64,
    /// Each script last sent again whole (`EVAL`, after `NOSCRIPT`), and the `seq` it went
    /// with: a call of it answered `NOSCRIPT` that was sent before then is sent again as it
    /// was, behind the `EVAL` that loads the script, rather than with the script's whole body
    /// too (61 KB, and every call of a pipeline written before a `SCRIPT FLUSH` is answered
    /// `NOSCRIPT`).
    evals: Vec<(&'static Script, u64)>,
    timer: Pin<Box<Sleep>>,
    timer_at: Option<Instant>,
}

struct Waiter {
    /// Who waits for the reply: `None` for the connection's own `AUTH` and `SELECT`, and once
    /// the caller was answered with a timeout (the reply is then read and dropped).
    reply: Option<oneshot::Sender<RedisResult<Value>>>,
    deadline: Instant,
    /// The call, to send again as `EVAL` if the server does not know its script; `None` once it
    /// has been.
    retry: Option<(Vec<u8>, &'static Script)>,
    /// Whether this is the connection's own `AUTH` or `SELECT`.
    setup: bool,
    /// Which command this is, in the order they were put in `out`.
    seq: u64,
}

impl Pipe {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let took = self.take_calls(cx);
            if took && !self.yielded {
                // See the batch task: every task that is ready runs before the write.
                self.yielded = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            self.yielded = false;
            let mut again = took;
            // Read first: a server that closed the connection while it was idle is noticed
            // before calls are written to it, and they go on a new one.
            again |= self.poll_read(cx);
            again |= self.poll_connection(cx);
            self.send_held();
            again |= self.poll_write(cx);
            again |= self.poll_deadlines(cx);
            if self.queue.is_none() && self.held.is_empty() && self.waiting.is_empty() {
                return Poll::Ready(());
            }
            if !again {
                return Poll::Pending;
            }
        }
    }

    /// Moves the calls waiting in the queue to `held`; whether there were any.
    fn take_calls(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(queue) = &mut self.queue else {
            return false;
        };
        let mut took = false;
        for _ in 0..MAX_BATCH {
            match queue.poll_recv(cx) {
                Poll::Ready(Some(call)) => {
                    self.held.push(call);
                    took = true;
                }
                Poll::Ready(None) => {
                    self.queue = None;
                    break;
                }
                Poll::Pending => break,
            }
        }
        took
    }

    /// Dials when calls are held and there is no connection, and finishes dialing. Whether
    /// anything changed.
    fn poll_connection(&mut self, cx: &mut Context<'_>) -> bool {
        if let Wire::Open(open) = &self.wire {
            if !self.held.is_empty() && self.waiting.is_empty() && open.closed_while_idle() {
                self.wire = Wire::Idle;
                (self.parsed, self.filled) = (0, 0);
            }
        }
        if matches!(self.wire, Wire::Idle) && !self.held.is_empty() {
            self.wire = Wire::Connecting(Box::pin(self.dial.clone().connect()));
        }
        let Wire::Connecting(connecting) = &mut self.wire else {
            return false;
        };
        match connecting.as_mut().poll(cx) {
            Poll::Pending => false,
            Poll::Ready(Ok(open)) => {
                self.wire = Wire::Open(open);
                self.out.extend_from_slice(&self.dial.hello);
                for _ in 0..self.dial.hello_replies {
                    let seq = self.next_seq();
                    self.waiting.push_back(Waiter {
                        reply: None,
                        deadline: Instant::now() + self.dial.connect_timeout,
                        retry: None,
                        setup: true,
                        seq,
                    });
                }
                true
            }
            Poll::Ready(Err(e)) => {
                // The calls held would dial again at once: they fail with the dial instead.
                let e = RedisError::from(e);
                for call in self.held.drain(..) {
                    let _ = call.reply.send(Err(e.clone()));
                }
                self.close(&e);
                true
            }
        }
    }

    /// Puts the held calls in the write buffer, once connected and `AUTH` and `SELECT` have
    /// been answered: a call pipelined behind a refused `AUTH` would run as the default user.
    fn send_held(&mut self) {
        if !matches!(self.wire, Wire::Open(_)) || self.waiting.front().is_some_and(|w| w.setup) {
            return;
        }
        for call in self.held.drain(..) {
            self.out.extend_from_slice(&call.command);
            self.sent += 1;
            let seq = self.sent;
            self.waiting.push_back(Waiter {
                reply: Some(call.reply),
                deadline: call.deadline,
                retry: Some((call.command, call.script)),
                setup: false,
                seq,
            });
        }
    }

    /// The `seq` of the next command put in `out`.
    fn next_seq(&mut self) -> u64 {
        self.sent += 1;
        self.sent
    }

    /// Writes what it can of the write buffer. Whether anything changed.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> bool {
        let Wire::Open(Open { stream, .. }) = &mut self.wire else {
            return false;
        };
        let mut progressed = false;
        while self.written < self.out.len() {
            match Pin::new(&mut *stream).poll_write(cx, &self.out[self.written..]) {
                Poll::Pending => break,
                Poll::Ready(Ok(0)) => {
                    let e = io::Error::new(io::ErrorKind::WriteZero, "redis took no bytes");
                    self.close(&e.into());
                    return true;
                }
                Poll::Ready(Ok(n)) => {
                    self.written += n;
                    progressed = true;
                }
                Poll::Ready(Err(e)) => {
                    self.close(&e.into());
                    return true;
                }
            }
        }
        if self.written == self.out.len() {
            self.out.clear();
            self.written = 0;
        }
        progressed
    }

    /// Reads what has arrived and answers the calls it replies to. Reads also while nothing is
    /// waiting, to notice a server that closed an idle connection before a call is written to
    /// it. Whether anything changed.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progressed = false;
        loop {
            let Wire::Open(Open { stream, .. }) = &mut self.wire else {
                return progressed;
            };
            if self.parsed == self.filled {
                (self.parsed, self.filled) = (0, 0);
            } else if self.input.len() - self.filled < READ_CHUNK / 4 {
                self.input.copy_within(self.parsed..self.filled, 0);
                (self.parsed, self.filled) = (0, self.filled - self.parsed);
                if self.input.len() - self.filled < READ_CHUNK / 4 {
                    self.input.resize(self.input.len() + READ_CHUNK, 0);
                }
            }
            let mut buf = ReadBuf::new(&mut self.input[self.filled..]);
            match Pin::new(&mut *stream).poll_read(cx, &mut buf) {
                Poll::Pending => return progressed,
                Poll::Ready(Ok(())) if buf.filled().is_empty() => {
                    let e = io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "redis closed the connection",
                    );
                    self.close(&e.into());
                    return true;
                }
                Poll::Ready(Ok(())) => {
                    self.filled += buf.filled().len();
                    progressed = true;
                    if let Err(e) = self.answer_replies() {
                        self.close(&e);
                        return true;
                    }
                }
                Poll::Ready(Err(e)) => {
                    self.close(&e.into());
                    return true;
                }
            }
        }
    }

    /// Parses the whole replies read, and answers the calls at the front with them.
    fn answer_replies(&mut self) -> Result<(), RedisError> {
        while let Some((reply, used)) = parse_reply(&self.input[self.parsed..self.filled])? {
            self.parsed += used;
            let Some(waiter) = self.waiting.pop_front() else {
                return Err(protocol_error("a reply to no command"));
            };
            if waiter.setup {
                // `AUTH` or `SELECT`: the connection is unusable if they failed, and stays not
                // ready (its waiter back at the front) as it closes.
                if let Err(e) = reply {
                    self.waiting.push_front(waiter);
                    return Err(e);
                }
                continue;
            }
            let Some(sender) = waiter.reply else {
                continue;
            };
            match (reply, waiter.retry) {
                (Err(e), Some((command, script))) if is_no_script(&e) => {
                    // An `EVAL` of the script sent after this call loads it before this call
                    // comes round again.
                    let loading = self
                        .evals
                        .iter()
                        .any(|&(s, at)| std::ptr::eq(s, script) && waiter.seq < at);
                    let seq = self.next_seq();
                    let retry = if loading {
                        self.out.extend_from_slice(&command);
                        Some((command, script))
                    } else {
                        self.out.extend_from_slice(&as_eval(&command, script));
                        self.evals.retain(|&(s, _)| !std::ptr::eq(s, script));
                        self.evals.push((script, seq));
                        None
                    };
                    self.waiting.push_back(Waiter {
                        reply: Some(sender),
                        deadline: waiter.deadline,
                        retry,
                        setup: false,
                        seq,
                    });
                }
                (reply, _) => {
                    let _ = sender.send(reply);
                }
            }
        }
        Ok(())
    }

    /// Answers the calls whose deadline has passed with a timeout, and arms the timer for the
    /// earliest deadline still running. Whether the timer fired.
    fn poll_deadlines(&mut self, cx: &mut Context<'_>) -> bool {
        let earliest = self
            .waiting
            .iter()
            .filter(|w| w.reply.is_some())
            .map(|w| w.deadline)
            .chain(self.held.iter().map(|c| c.deadline))
            .min();
        let Some(earliest) = earliest else {
            self.timer_at = None;
            return false;
        };
        if self.timer_at != Some(earliest) {
            self.timer.as_mut().reset(earliest);
            self.timer_at = Some(earliest);
        }
        if self.timer.as_mut().poll(cx).is_pending() {
            return false;
        }
        self.timer_at = None;
        let now = Instant::now();
        for waiter in &mut self.waiting {
            if waiter.deadline <= now {
                if let Some(reply) = waiter.reply.take() {
                    let _ = reply.send(Err(timed_out()));
                }
            }
        }
        let (late, held): (Vec<Call>, Vec<Call>) =
            self.held.drain(..).partition(|c| c.deadline <= now);
        self.held = held;
        for call in late {
            let _ = call.reply.send(Err(timed_out()));
        }
        true
    }

    /// Drops the connection after `e`: every call written to it is answered with `e`, and so
    /// are the calls held for it if it failed before it was ready (they would dial again at
    /// once, into the same refusal).
    fn close(&mut self, e: &RedisError) {
        self.wire = Wire::Idle;
        if self.waiting.front().is_some_and(|w| w.setup) {
            for call in self.held.drain(..) {
                let _ = call.reply.send(Err(e.clone()));
            }
        }
        for waiter in self.waiting.drain(..) {
            if let Some(reply) = waiter.reply {
                let _ = reply.send(Err(e.clone()));
            }
        }
        self.out.clear();
        self.written = 0;
        (self.parsed, self.filled) = (0, 0);
    }
}

/// `EVALSHA sha numkeys keys… args…` for `script`, packed for the wire.
pub(crate) fn pack_eval_sha<A: AsRef<[u8]>>(
    script: &'static Script,
    keys: &[String],
    args: &[A],
) -> Vec<u8> {
    let mut digits = [0u8; 20];
    let from = decimal(keys.len() as u64, &mut digits);
    let fixed: [&[u8]; 3] = [b"EVALSHA", script.sha.as_bytes(), &digits[from..]];
    let keys = keys.iter().map(String::as_bytes);
    pack(
        fixed
            .into_iter()
            .chain(keys)
            .chain(args.iter().map(AsRef::as_ref)),
    )
}

/// `command`, a packed `EVALSHA`, as the `EVAL` of `script` with the same keys and arguments.
pub(crate) fn as_eval(command: &[u8], script: &Script) -> Vec<u8> {
    let parts = unpack(command);
    let head: [&[u8]; 2] = [b"EVAL", script.body.as_bytes()];
    pack(head.into_iter().chain(parts.into_iter().skip(2)))
}

/// The command of `parts`, packed for the wire (an array of bulk strings).
///
/// Sized exactly first, then written in place: one copy per part, where growing the buffer
/// part by part cost three copies and three capacity checks for each of a check's dozen parts.
fn pack<'a>(parts: impl Iterator<Item = &'a [u8]> + Clone) -> Vec<u8> {
    let (count, len) = parts.clone().fold((0, 0), |(count, len), p| {
        (count + 1, len + header_len(p.len()) + p.len() + 2)
    });
    let mut out = vec![0u8; header_len(count) + len];
    let mut at = put_header(&mut out, 0, b'*', count);
    for part in parts {
        at = put_header(&mut out, at, b'$', part.len());
        out[at..at + part.len()].copy_from_slice(part);
        out[at + part.len()..at + part.len() + 2].copy_from_slice(b"\r\n");
        at += part.len() + 2;
    }
    out
}

/// The length of `*n\r\n` or `$n\r\n`.
fn header_len(n: usize) -> usize {
    // Most parts of a call are short: their headers are read off at once.
    match n {
        0..=9 => return 4,
        10..=99 => return 5,
        _ => {}
    }
    let mut digits = 1;
    let mut rest = n / 10;
    while rest > 0 {
        digits += 1;
        rest /= 10;
    }
    digits + 3
}

/// Writes `kind`, `n` in decimal and CRLF at `at` in `out`; returns where they end.
fn put_header(out: &mut [u8], at: usize, kind: u8, n: usize) -> usize {
    // One or two digits, as most parts of a call have: written byte by byte.
    if n < 10 {
        let h = &mut out[at..at + 4];
        (h[0], h[1], h[2], h[3]) = (kind, b'0' + n as u8, b'\r', b'\n');
        return at + 4;
    }
    if n < 100 {
        let h = &mut out[at..at + 5];
        let (tens, ones) = (b'0' + (n / 10) as u8, b'0' + (n % 10) as u8);
        (h[0], h[1], h[2], h[3], h[4]) = (kind, tens, ones, b'\r', b'\n');
        return at + 5;
    }
    let end = at + header_len(n);
    out[at] = kind;
    out[end - 2..end].copy_from_slice(b"\r\n");
    decimal(n as u64, &mut out[at + 1..end - 2]);
    end
}

/// The parts of a packed command (as [`pack`] writes it).
pub(crate) fn unpack(mut command: &[u8]) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    let Some((count, used)) = header(command, b'*') else {
        return parts;
    };
    command = &command[used..];
    for _ in 0..count {
        let Some((len, used)) = header(command, b'$') else {
            break;
        };
        let Some(part) = command.get(used..used + len) else {
            break;
        };
        parts.push(part);
        command = command.get(used + len + 2..).unwrap_or_default();
    }
    parts
}

/// `*N\r\n` or `$N\r\n` at the front of `bytes`: N and the header's length.
fn header(bytes: &[u8], kind: u8) -> Option<(usize, usize)> {
    let (&first, rest) = bytes.split_first()?;
    let end = rest.iter().position(|&b| b == b'\r')?;
    (first == kind).then_some(())?;
    let n = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
    Some((n, end + 3))
}

/// Writes `n` in decimal at the end of `buf` (room for its digits, 20 at most); returns where
/// it starts.
pub(crate) fn decimal(mut n: u64, buf: &mut [u8]) -> usize {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return at;
        }
    }
}

/// The deepest nesting of arrays a reply may have; the scripts answer a string or a flat array.
const MAX_DEPTH: usize = 8;

/// The reply at the front of `bytes` (RESP2) and its length, or `None` until all of it has
/// arrived. A reply that is an error is an `Err` inside the `Some`; bytes that are not RESP
/// are an `Err` outside it.
pub(crate) fn parse_reply(bytes: &[u8]) -> Result<Option<(RedisResult<Value>, usize)>, RedisError> {
    let Some((value, used)) = parse_value(bytes, 0)? else {
        return Ok(None);
    };
    Ok(Some((value.extract_error(), used)))
}

fn parse_value(bytes: &[u8], depth: usize) -> Result<Option<(Value, usize)>, RedisError> {
    let Some(end) = line_end(bytes) else {
        return Ok(None);
    };
    if end == 0 {
        return Err(protocol_error("a line with no type"));
    }
    let line = &bytes[1..end];
    let after = end + 2;
    let number = || -> Result<i64, RedisError> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| protocol_error("a length or integer that is not a number"))
    };
    let value = match bytes[0] {
        b'+' if line == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(
            String::from_utf8(line.to_vec())
                .map_err(|_| protocol_error("a simple string that is not UTF-8"))?,
        ),
        // The crate's own parser, so that the error's kind (`NOSCRIPT`, `BUSY`, `READONLY`…)
        // is the one the rest of the store matches on.
        b'-' => redis::parse_redis_value(&bytes[..after])?,
        b':' => Value::Int(number()?),
        b'$' => {
            let len = number()?;
            if len < 0 {
                return Ok(Some((Value::Nil, after)));
            }
            let len = usize::try_from(len).map_err(|_| protocol_error("a bulk string too long"))?;
            let Some(body) = bytes.get(after..after.saturating_add(len).saturating_add(2)) else {
                return Ok(None);
            };
            if !body.ends_with(b"\r\n") {
                return Err(protocol_error("a bulk string not ended by CRLF"));
            }
            return Ok(Some((
                Value::BulkString(body[..len].to_vec()),
                after + len + 2,
            )));
        }
        b'*' => {
            let count = number()?;
            if count < 0 {
                return Ok(Some((Value::Nil, after)));
            }
            if depth >= MAX_DEPTH {
                return Err(protocol_error("arrays nested too deep"));
            }
            let count = usize::try_from(count).map_err(|_| protocol_error("an array too long"))?;
            // Each element takes three bytes at least: a count beyond what has arrived says
            // nothing yet, and allocates nothing.
            let mut items = Vec::with_capacity(count.min(bytes.len() / 3));
            let mut at = after;
            for _ in 0..count {
                let Some((item, used)) = parse_value(&bytes[at..], depth + 1)? else {
                    return Ok(None);
                };
                items.push(item);
                at += used;
            }
            return Ok(Some((Value::Array(items), at)));
        }
        _ => return Err(protocol_error("a reply of no RESP2 type")),
    };
    Ok(Some((value, after)))
}

/// Where the first line of `bytes` ends (its `\r\n`), if it has.
fn line_end(bytes: &[u8]) -> Option<usize> {
    let end = bytes.iter().position(|&b| b == b'\r')?;
    (bytes.get(end + 1)? == &b'\n').then_some(end)
}

fn protocol_error(what: &'static str) -> RedisError {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("redis sent bytes that are not a reply: {what}"),
    )
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripts::HEARTBEAT;

    fn parsed(bytes: &[u8]) -> (RedisResult<Value>, usize) {
        parse_reply(bytes).unwrap().expect("a whole reply")
    }

    #[test]
    fn replies_parse_as_the_crates_parser_reads_them() {
        let replies: [&[u8]; 9] = [
            b"+OK\r\n",
            b"+PONG\r\n",
            b":-42\r\n",
            b"$5\r\nhello\r\n",
            b"$0\r\n\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"*3\r\n:1\r\n$2\r\nab\r\n*1\r\n+x\r\n",
            b"*0\r\n",
        ];
        for bytes in replies {
            let (value, used) = parsed(bytes);
            assert_eq!(used, bytes.len(), "{bytes:?}");
            assert_eq!(value.unwrap(), redis::parse_redis_value(bytes).unwrap());
        }
    }

    #[test]
    fn an_error_reply_keeps_its_kind() {
        let (value, used) = parsed(b"-NOSCRIPT No matching script.\r\n:1\r\n");
        assert_eq!(used, 31);
        assert!(is_no_script(&value.unwrap_err()));
        let (value, _) = parsed(b"-BUSY Redis is busy running a script.\r\n");
        assert_eq!(value.unwrap_err().code(), Some("BUSY"));
    }

    #[test]
    fn a_reply_in_pieces_waits_for_the_rest() {
        let whole = b"*2\r\n$3\r\nabc\r\n:7\r\n";
        for cut in 0..whole.len() {
            assert!(
                parse_reply(&whole[..cut]).unwrap().is_none(),
                "cut at {cut}"
            );
        }
        assert_eq!(parsed(whole).1, whole.len());
    }

    #[test]
    fn bytes_that_are_not_resp_are_refused() {
        for bytes in [
            &b"\r\n:\r 7\r"[..],
            b"+\xd4\r\n",
            b"*1\r\n\r\n",
            b"?1\r\n",
            b":x\r\n",
            b"$3\r\nabcd\r\n",
            b"*99999999999999999999\r\n",
        ] {
            assert!(parse_reply(bytes).is_err(), "{bytes:?}");
        }
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1);
        assert!(parse_reply(deep.as_bytes()).is_err());
    }

    #[test]
    fn a_packed_call_is_the_crates_command_and_becomes_eval() {
        let keys = ["k1".to_owned(), "{k}2".to_owned()];
        let args = ["0", "", "12345678901"];
        let packed = pack_eval_sha(&HEARTBEAT, &keys, &args);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&HEARTBEAT.sha).arg(2).arg(&keys).arg(&args);
        assert_eq!(packed, cmd.get_packed_command());

        let eval = as_eval(&packed, &HEARTBEAT);
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(&HEARTBEAT.body).arg(2).arg(&keys).arg(&args);
        assert_eq!(eval, cmd.get_packed_command());
        assert_eq!(unpack(&packed).len(), 8);
    }

    /// Parts whose lengths cross every width of the header's count, and calls of more than
    /// nine and more than ninety-nine parts, pack as the crate packs them.
    #[test]
    fn packed_headers_of_every_width_are_the_crates() {
        for len in [0, 1, 9, 10, 11, 99, 100, 101, 999, 1_000, 65_536] {
            let keys = ["k".repeat(len)];
            let args = ["a".repeat(len), "x".to_owned()];
            let packed = pack_eval_sha(&HEARTBEAT, &keys, &args);
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&HEARTBEAT.sha).arg(1).arg(&keys).arg(&args);
            assert_eq!(packed, cmd.get_packed_command(), "parts of {len} bytes");
        }
        for parts in [6, 7, 96, 97, 120] {
            let args: Vec<String> = (0..parts).map(|i| i.to_string()).collect();
            let packed = pack_eval_sha(&HEARTBEAT, &[], &args);
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&HEARTBEAT.sha).arg(0).arg(&args);
            assert_eq!(packed, cmd.get_packed_command(), "{parts} arguments");
        }
    }
}
