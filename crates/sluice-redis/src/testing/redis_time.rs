//! Redis time, and offsets that start a store's time just after a window boundary.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Redis `TIME` on the server at `port`, in nanoseconds since the epoch.
pub fn redis_time_nanos(port: u16) -> i64 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    s.write_all(b"*1\r\n$4\r\nTIME\r\n").expect("write");
    let mut buf = [0u8; 256];
    let mut got = Vec::new();
    while got.iter().filter(|&&b| b == b'\n').count() < 5 {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "TIME reply cut short");
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    let nums: Vec<i64> = text
        .lines()
        .filter(|l| !l.starts_with('*') && !l.starts_with('$'))
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    nums[0] * 1_000_000_000 + nums[1] * 1_000
}

/// The offset that puts a store's time 20 ms after a whole second of Redis time, so that a test
/// of one-second windows does not start just before a boundary. The suite runs on real Redis
/// time, which keeps moving (a few milliseconds per test); without this, a clock-aligned window
/// rolling over mid-test would make an exact count flaky.
pub fn offset_to_second_start(port: u16) -> i64 {
    offset_to_window_start(port, Duration::from_secs(1))
}

/// The offset that puts a store's time 20 ms after the start of a clock-aligned `window`.
pub fn offset_to_window_start(port: u16, window: Duration) -> i64 {
    let w = i64::try_from(window.as_nanos()).expect("a window below 292 years");
    let phase = redis_time_nanos(port).rem_euclid(w);
    w - phase + 20_000_000
}
