//! When an h2 client is part way through sending a request's head, told by watching the frames
//! it sends, so that a head trickled over many frames is cut at the header timeout.
//!
//! An h2 request head is a header block: a `HEADERS` frame, and while that frame does not say
//! `END_HEADERS`, `CONTINUATION` frames until one does. h2 (the crate hyper serves h2 with)
//! gathers the block with no time limit and offers no hook to set one, and while a block is
//! open no other frame may come, a ping's answer included: a client trickling a block one
//! frame at a time was held until the keep-alive ping went unanswered (30 s). The first head on
//! a connection is bounded by the connection's header deadline
//! ([`connection_deadlines`](crate::connection_deadlines)); this bounds every later one:
//! [`HeaderBlocks`] wraps the connection's stream, reads the 9-byte header of each frame as it
//! passes (never the payload, never a copy), and tells the connection's [`Activity`] when a
//! block opens and when it ends. A block open for longer than `--header-timeout` closes the
//! connection. A stream that does not begin with the h2 preface (HTTP/1.1, whose heads hyper
//! bounds itself) is not looked at past its first bytes.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::connection_deadlines::Activity;

/// The client's first bytes on an h2 connection.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The length of a frame's header.
const FRAME_HEADER: usize = 9;
/// `HEADERS`, `PUSH_PROMISE` (which begin a block) and `CONTINUATION` (which goes on with one).
const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;
/// The flag that ends a block.
const END_HEADERS: u8 = 0x4;

pin_project_lite::pin_project! {
    /// A connection's stream, whose incoming h2 header blocks are reported to its [`Activity`].
    #[derive(Debug)]
    pub struct HeaderBlocks<T> {
        #[pin]
        io: T,
        frames: Frames,
        activity: Activity,
    }
}

impl<T> HeaderBlocks<T> {
    /// `io`, reporting to `activity`.
    pub fn new(io: T, activity: Activity) -> Self {
        HeaderBlocks {
            io,
            frames: Frames::default(),
            activity,
        }
    }
}

impl<T: AsyncRead> AsyncRead for HeaderBlocks<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let read = this.io.poll_read(cx, buf);
        if this.frames.watching() {
            if let Some(open) = this.frames.scan(&buf.filled()[before..]) {
                this.activity.header_block(open);
            }
        }
        read
    }
}

impl<T: AsyncWrite> AsyncWrite for HeaderBlocks<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.project().io.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.project().io.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

/// Where the incoming bytes are in the h2 framing.
#[derive(Debug, Default)]
struct Frames {
    /// Bytes of the preface seen so far.
    preface: usize,
    /// The stream is not h2: nothing more to look at.
    not_h2: bool,
    /// The frame header read so far.
    header: [u8; FRAME_HEADER],
    header_len: usize,
    /// Payload bytes of the current frame still to pass.
    payload_left: usize,
    /// Whether a header block is open.
    open: bool,
}

impl Frames {
    fn watching(&self) -> bool {
        !self.not_h2
    }

    /// Follows the framing through `bytes`; returns whether a header block is open after them
    /// when that changed, or `Some(true)` when the block open after them began in them (so
    /// that its time counts from now, not from an earlier block's start).
    fn scan(&mut self, mut bytes: &[u8]) -> Option<bool> {
        let was_open = self.open;
        let mut began = false;
        if self.preface < PREFACE.len() {
            let n = bytes.len().min(PREFACE.len() - self.preface);
            if bytes[..n] != PREFACE[self.preface..self.preface + n] {
                self.not_h2 = true;
                return None;
            }
            self.preface += n;
            bytes = &bytes[n..];
        }
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let n = bytes.len().min(self.payload_left);
                self.payload_left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = bytes.len().min(FRAME_HEADER - self.header_len);
            self.header[self.header_len..self.header_len + n].copy_from_slice(&bytes[..n]);
            self.header_len += n;
            bytes = &bytes[n..];
            if self.header_len == FRAME_HEADER {
                self.header_len = 0;
                let h = self.header;
                self.payload_left =
                    usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                let ends = h[4] & END_HEADERS != 0;
                match h[3] {
                    HEADERS | PUSH_PROMISE => {
                        self.open = !ends;
                        began = !ends;
                    }
                    CONTINUATION if ends => self.open = false,
                    _ => {}
                }
            }
        }
        if self.open && began {
            return Some(true);
        }
        (self.open != was_open).then_some(self.open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len().to_be_bytes();
        let mut f = vec![len[5], len[6], len[7], kind, flags, 0, 0, 0, 1];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn a_block_opens_with_headers_and_ends_with_end_headers_across_any_reads() {
        let mut stream = PREFACE.to_vec();
        stream.extend(frame(0x4, 0, &[])); // SETTINGS
        let open_at = stream.len();
        stream.extend(frame(HEADERS, 0, &[0x82; 40]));
        stream.extend(frame(CONTINUATION, 0, &[0x84; 3]));
        let closed_at = stream.len();
        stream.extend(frame(CONTINUATION, END_HEADERS, &[0x86]));
        stream.extend(frame(HEADERS, END_HEADERS, &[0x82]));
        for chunk in [1, 2, 7, 9, 10, 13] {
            let mut frames = Frames::default();
            let mut changes = Vec::new();
            for (i, piece) in stream.chunks(chunk).enumerate() {
                if let Some(open) = frames.scan(piece) {
                    changes.push((i * chunk + piece.len(), open));
                }
            }
            let (opened, closed) = (changes[0], changes[1]);
            assert!(opened.1 && opened.0 > open_at, "{chunk}: {changes:?}");
            assert!(!closed.1 && closed.0 > closed_at, "{chunk}: {changes:?}");
            assert_eq!(changes.len(), 2, "{chunk}: {changes:?}");
        }
    }

    #[test]
    fn a_block_that_begins_as_another_ends_is_told_as_new() {
        let mut frames = Frames::default();
        let mut first = PREFACE.to_vec();
        first.extend(frame(HEADERS, 0, &[0x82]));
        assert_eq!(frames.scan(&first), Some(true));
        let mut next = frame(CONTINUATION, END_HEADERS, &[0x84]);
        next.extend(frame(HEADERS, 0, &[0x82]));
        assert_eq!(
            frames.scan(&next),
            Some(true),
            "the second block's own start"
        );
        assert_eq!(frames.scan(&frame(CONTINUATION, 0, &[0x84])), None);
    }

    #[test]
    fn http1_is_not_looked_at() {
        let mut frames = Frames::default();
        assert_eq!(frames.scan(b"PRI"), None);
        assert!(frames.watching());
        assert_eq!(frames.scan(b" * HTTP/1.1"), None);
        assert!(!frames.watching());
    }
}
