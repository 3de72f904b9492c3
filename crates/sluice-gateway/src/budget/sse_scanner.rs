//! Reading usage from a `text/event-stream` answer as it passes through, without holding it:
//! events are cut from the bytes as they arrive, and each one's data is read as JSON for the
//! usage path. Memory is bounded per stream, whatever the upstream sends.

use sluice_rules::JsonPath;

use super::json_units::units_in;

/// The longest line and the most data of one event that are kept. A usage event is a few
/// hundred bytes; a longer line or event is passed through unread, so that an upstream cannot
/// make the gateway hold an unbounded event.
pub(crate) const MAX_EVENT: usize = 64 * 1024;

/// The state of one stream: the line being cut, the data of the event being built, and the
/// last usage read.
#[derive(Debug)]
pub(crate) struct SseScanner {
    path: JsonPath,
    /// The key the path ends in, quoted, as a cheap filter: an event whose data does not hold
    /// it is not parsed.
    needle: Option<Vec<u8>>,
    line: Vec<u8>,
    /// The current line went past [`MAX_EVENT`]: the rest of it is skipped.
    line_too_long: bool,
    /// The previous byte was a `\r`, so a `\n` right after it ends nothing more.
    after_cr: bool,
    data: Vec<u8>,
    /// The current event's data went past [`MAX_EVENT`]: the event is skipped.
    event_too_long: bool,
    last: Option<u64>,
}

impl SseScanner {
    /// A scanner reading the units at `path` in each event's data.
    pub(crate) fn new(path: JsonPath) -> Self {
        let needle = path.last_key().map(|k| format!("\"{k}\"").into_bytes());
        SseScanner {
            path,
            needle,
            line: Vec::new(),
            line_too_long: false,
            after_cr: false,
            data: Vec::new(),
            event_too_long: false,
            last: None,
        }
    }

    /// Reads the next bytes of the stream.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if bytes[0] == b'\n' {
                    bytes = &bytes[1..];
                    continue;
                }
            }
            match bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(end) => {
                    self.push_line(&bytes[..end]);
                    self.after_cr = bytes[end] == b'\r';
                    self.end_line();
                    bytes = &bytes[end + 1..];
                }
                None => {
                    self.push_line(bytes);
                    return;
                }
            }
        }
    }

    /// The usage of the last event that had one.
    pub(crate) fn last_usage(&self) -> Option<u64> {
        self.last
    }

    /// The stream ended: an event not closed by a blank line still counts when its data reads
    /// whole, as upstreams that end on the last `data:` line mean it.
    pub(crate) fn finish(&mut self) -> Option<u64> {
        if !self.line.is_empty() {
            self.end_line();
        }
        self.dispatch();
        self.last
    }

    fn push_line(&mut self, bytes: &[u8]) {
        if self.line_too_long {
            return;
        }
        if self.line.len() + bytes.len() > MAX_EVENT {
            self.line_too_long = true;
            self.line.clear();
            return;
        }
        self.line.extend_from_slice(bytes);
    }

    fn end_line(&mut self) {
        if self.line_too_long {
            // A line that was not kept may have been data: the event cannot be read whole.
            self.line_too_long = false;
            self.event_too_long = true;
            return;
        }
        if self.line.is_empty() {
            self.dispatch();
            return;
        }
        if let Some(value) = self.line.strip_prefix(b"data:") {
            let value = value.strip_prefix(b" ").unwrap_or(value);
            if self.data.len() + value.len() + 1 > MAX_EVENT {
                self.event_too_long = true;
            } else if !self.event_too_long {
                if !self.data.is_empty() {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
            }
        }
        // `event:`, `id:`, `retry:` and comments say nothing of usage.
        self.line.clear();
    }

    fn dispatch(&mut self) {
        let readable = !self.event_too_long
            && !self.data.is_empty()
            && self
                .needle
                .as_ref()
                .is_none_or(|n| self.data.windows(n.len()).any(|w| w == n.as_slice()));
        if readable {
            if let Some(units) = units_in(&self.data, &self.path) {
                self.last = Some(units);
            }
        }
        self.data.clear();
        self.event_too_long = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanner() -> SseScanner {
        SseScanner::new(JsonPath::parse("usage.total_tokens").unwrap())
    }

    const STREAM: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n\
                          : a comment\n\
                          event: message\n\
                          data: {\"usage\":{\"total_tokens\":17}}\n\n\
                          data: {\"choices\":[],\n\
                          data: \"usage\":{\"total_tokens\":23}}\n\n\
                          data: [DONE]\n\n";

    #[test]
    fn the_last_usage_is_read_however_the_stream_is_cut_into_chunks() {
        for line_end in ["\n", "\r\n", "\r"] {
            let text = STREAM.replace('\n', line_end);
            for size in [1, 2, 3, 7, 64, text.len()] {
                let mut s = scanner();
                for chunk in text.as_bytes().chunks(size) {
                    s.feed(chunk);
                }
                assert_eq!(s.last_usage(), Some(23), "{line_end:?} in chunks of {size}");
                assert_eq!(s.finish(), Some(23));
            }
        }
    }

    #[test]
    fn an_event_is_read_only_once_it_ends() {
        let mut s = scanner();
        s.feed(b"data: {\"usage\":{\"total_tokens\":5}}\n");
        assert_eq!(s.last_usage(), None, "the event has not ended");
        s.feed(b"\n");
        assert_eq!(s.last_usage(), Some(5));
        // A stream that ends on its last data line without a blank line still counts it.
        s.feed(b"data: {\"usage\":{\"total_tokens\":9}}");
        assert_eq!(s.finish(), Some(9));
        // A cut event is not read.
        let mut cut = scanner();
        cut.feed(b"data: {\"usage\":{\"total_tok");
        assert_eq!(cut.finish(), None);
    }

    #[test]
    fn memory_is_bounded_and_oversized_events_are_skipped() {
        let mut s = scanner();
        let filler = vec![b'x'; MAX_EVENT];
        s.feed(b"data: {\"usage\":{\"total_tokens\":3},\"pad\":\"");
        s.feed(&filler);
        s.feed(b"\"}\n\n");
        assert_eq!(s.last_usage(), None, "a line past the bound is not read");
        assert!(s.line.capacity() <= 2 * MAX_EVENT && s.data.capacity() <= 2 * MAX_EVENT);
        // Many data lines that together pass the bound: skipped as a whole.
        for _ in 0..(MAX_EVENT / 1024 + 1) {
            s.feed(b"data: ");
            s.feed(&filler[..1024]);
            s.feed(b"\n");
        }
        s.feed(b"\n");
        assert_eq!(s.last_usage(), None);
        assert!(s.data.capacity() <= 2 * MAX_EVENT);
        // The stream reads on afterwards.
        s.feed(b"data: {\"usage\":{\"total_tokens\":4}}\n\n");
        assert_eq!(s.last_usage(), Some(4));
    }
}
