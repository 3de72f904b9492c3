//! Where an HTTP/1.1 answer's body ends (RFC 9112 §6.3), and the decoding of its frames from
//! the bytes read so far: a length, chunks, or the connection's end.
//!
//! Pure: it takes bytes from a buffer and says what it needs next, so every framing case is
//! tested here without a socket, and the connection that reads for it stays small.

use std::io;

use bytes::{Buf, Bytes, BytesMut};

/// The longest chunk-size line (with its extensions) or trailer section accepted: enough for any
/// real extension, small enough that a peer sending an endless line is cut off.
const MAX_FRAMING_LINE: usize = 4096;

/// The longest trailer section accepted; trailers are read past, not forwarded.
const MAX_TRAILERS: usize = 16 * 1024;

/// How an answer's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body: a `HEAD` request's answer, `204`, `304`, or `Content-Length: 0`.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Everything until the upstream closes the connection, which then cannot be reused.
    Close,
}

/// What [`Decoder::decode`] found in the buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Body bytes, to pass on.
    Data(Bytes),
    /// More bytes must be read before anything else can be said.
    NeedMore,
    /// The body has ended; the buffer holds whatever follows it.
    End,
}

/// Decodes one answer's body from the bytes read for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decoder {
    /// This many bytes of a `Content-Length` body are still to come.
    Length(u64),
    /// A chunked body, at this point of its grammar.
    Chunked(Chunk),
    /// Until the connection closes.
    Close,
    /// Nothing more: the body has ended.
    Done,
}

/// Where a chunked body is (RFC 9112 §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chunk {
    /// A chunk-size line is next.
    Size,
    /// This many bytes of the current chunk's data are still to come.
    Data(u64),
    /// The CRLF after a chunk's data is next.
    DataEnd,
    /// The trailer section after the last chunk, this many of its bytes read so far.
    Trailers(usize),
}

impl Decoder {
    pub(crate) fn new(framing: Framing) -> Decoder {
        match framing {
            Framing::Empty | Framing::Length(0) => Decoder::Done,
            Framing::Length(n) => Decoder::Length(n),
            Framing::Chunked => Decoder::Chunked(Chunk::Size),
            Framing::Close => Decoder::Close,
        }
    }

    /// Whether the body has ended.
    pub(crate) fn is_done(&self) -> bool {
        matches!(self, Decoder::Done)
    }

    /// Takes the next body bytes out of `buf`, or the framing around them.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Step, io::Error> {
        loop {
            match self {
                Decoder::Done => return Ok(Step::End),
                Decoder::Close if buf.is_empty() => return Ok(Step::NeedMore),
                Decoder::Close => return Ok(Step::Data(buf.split().freeze())),
                Decoder::Length(_) if buf.is_empty() => return Ok(Step::NeedMore),
                Decoder::Length(left) => {
                    let data = take(buf, left);
                    if *left == 0 {
                        *self = Decoder::Done;
                    }
                    return Ok(Step::Data(data));
                }
                Decoder::Chunked(chunk) => match chunk {
                    Chunk::Size => {
                        let Some(line) = line(buf)? else {
                            return Ok(Step::NeedMore);
                        };
                        let size = chunk_size(&line)?;
                        *chunk = if size == 0 {
                            Chunk::Trailers(0)
                        } else {
                            Chunk::Data(size)
                        };
                    }
                    Chunk::Data(_) if buf.is_empty() => return Ok(Step::NeedMore),
                    Chunk::Data(left) => {
                        let data = take(buf, left);
                        if *left == 0 {
                            *chunk = Chunk::DataEnd;
                        }
                        return Ok(Step::Data(data));
                    }
                    Chunk::DataEnd => {
                        if buf.len() < 2 {
                            return Ok(Step::NeedMore);
                        }
                        if &buf[..2] != b"\r\n" {
                            return Err(invalid("a chunk's data is not followed by CRLF"));
                        }
                        buf.advance(2);
                        *chunk = Chunk::Size;
                    }
                    Chunk::Trailers(read) => {
                        let Some(line) = line(buf)? else {
                            return Ok(Step::NeedMore);
                        };
                        if line.is_empty() {
                            *self = Decoder::Done;
                            return Ok(Step::End);
                        }
                        *read += line.len() + 2;
                        if *read > MAX_TRAILERS {
                            return Err(invalid("the trailer section is too long"));
                        }
                    }
                },
            }
        }
    }

    /// The connection closed: whether that ends the body or cuts it short.
    pub(crate) fn closed(&mut self) -> Result<(), io::Error> {
        match self {
            Decoder::Close | Decoder::Done => {
                *self = Decoder::Done;
                Ok(())
            }
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the upstream closed the connection before the answer's end",
            )),
        }
    }

    /// The bytes still to come, when known.
    pub(crate) fn remaining(&self) -> Option<u64> {
        match self {
            Decoder::Length(n) => Some(*n),
            Decoder::Done => Some(0),
            _ => None,
        }
    }
}

/// Up to `*left` bytes from the front of `buf`, counted off `left`.
fn take(buf: &mut BytesMut, left: &mut u64) -> Bytes {
    let n = usize::try_from(*left).map_or(buf.len(), |l| l.min(buf.len()));
    *left -= n as u64;
    buf.split_to(n).freeze()
}

/// The next line of `buf` without its CRLF, taken off the buffer; `None` until it is whole.
fn line(buf: &mut BytesMut) -> Result<Option<BytesMut>, io::Error> {
    let Some(end) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > MAX_FRAMING_LINE {
            return Err(invalid("a chunk-size or trailer line is too long"));
        }
        return Ok(None);
    };
    if end == 0 || buf[end - 1] != b'\r' {
        return Err(invalid("a chunk-size or trailer line does not end in CRLF"));
    }
    let mut line = buf.split_to(end + 1);
    line.truncate(end - 1);
    Ok(Some(line))
}

/// The size of a chunk-size line: hexadecimal digits, then optional whitespace and extensions.
fn chunk_size(line: &[u8]) -> Result<u64, io::Error> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return Err(invalid("a chunk size is not a hexadecimal number"));
    }
    let rest = &line[digits..];
    let rest = rest.trim_ascii_start();
    if !(rest.is_empty() || rest[0] == b';') {
        return Err(invalid(
            "a chunk size is followed by something other than extensions",
        ));
    }
    let mut size = 0u64;
    for &b in &line[..digits] {
        // At most 15 digits: no overflow.
        size = size * 16 + u64::from((b as char).to_digit(16).unwrap_or(0));
    }
    Ok(size)
}

fn invalid(why: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `chunks`, fed one after another, into the body and whether it ended.
    fn decode_all(
        framing: Framing,
        chunks: &[&[u8]],
    ) -> Result<(Vec<u8>, bool, BytesMut), io::Error> {
        let mut decoder = Decoder::new(framing);
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            buf.extend_from_slice(chunk);
            loop {
                match decoder.decode(&mut buf)? {
                    Step::Data(d) => body.extend_from_slice(&d),
                    Step::NeedMore => break,
                    Step::End => {
                        // What follows the body stays, with whatever arrives after it.
                        for later in &chunks[i + 1..] {
                            buf.extend_from_slice(later);
                        }
                        return Ok((body, true, buf));
                    }
                }
            }
        }
        Ok((body, false, buf))
    }

    #[test]
    fn a_length_body_ends_at_its_length_and_leaves_what_follows() {
        let (body, ended, rest) =
            decode_all(Framing::Length(5), &[b"he", b"llo", b"HTTP/1.1"]).unwrap();
        assert_eq!(body, b"hello");
        assert!(ended);
        assert_eq!(&rest[..], b"HTTP/1.1");
        let (_, ended, _) = decode_all(Framing::Length(5), &[b"hel"]).unwrap();
        assert!(!ended);
        assert!(
            Decoder::new(Framing::Length(5)).closed().is_err(),
            "cut short"
        );
        assert!(Decoder::new(Framing::Length(0)).is_done());
        assert!(Decoder::new(Framing::Empty).is_done());
    }

    #[test]
    fn chunks_are_decoded_across_any_split_with_extensions_and_trailers() {
        let wire: &[u8] = b"5;name=value\r\nhello\r\n6 \r\n world\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
        for split in 0..wire.len() {
            let (a, b) = wire.split_at(split);
            let (body, ended, rest) = decode_all(Framing::Chunked, &[a, b]).unwrap();
            assert_eq!(body, b"hello world", "split at {split}");
            assert!(ended, "split at {split}");
            assert_eq!(&rest[..], b"NEXT");
        }
        let (body, ended, _) =
            decode_all(Framing::Chunked, &[b"A\r\n0123456789\r\n0\r\n\r\n"]).unwrap();
        assert_eq!(body, b"0123456789");
        assert!(ended);
    }

    #[test]
    fn broken_chunks_are_refused() {
        for wire in [
            &b"zz\r\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhelloXX0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5 x\r\nhello\r\n",
            b"1234567890abcdef\r\n",
        ] {
            assert!(
                decode_all(Framing::Chunked, &[wire]).is_err(),
                "{}",
                String::from_utf8_lossy(wire)
            );
        }
        let endless = vec![b'1'; MAX_FRAMING_LINE + 1];
        assert!(decode_all(Framing::Chunked, &[&endless]).is_err());
        let mut unfinished = Decoder::new(Framing::Chunked);
        assert!(unfinished.closed().is_err());
    }

    #[test]
    fn a_close_delimited_body_is_everything_until_the_close() {
        let (body, ended, _) = decode_all(Framing::Close, &[b"all ", b"of it"]).unwrap();
        assert_eq!(body, b"all of it");
        assert!(!ended);
        let mut d = Decoder::new(Framing::Close);
        assert!(d.closed().is_ok());
        assert!(d.is_done());
    }
}
