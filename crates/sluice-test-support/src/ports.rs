//! Loopback ports for processes that tests start and that bind their ports themselves
//! (`sluice serve`, `redis-server`).
//!
//! Asking the kernel for port 0 and closing the socket hands out a port from the ephemeral range,
//! the same range the kernel draws from for every outgoing connection. A test that opens
//! connections while another starts a server can take the server's port as its own local port
//! between the two steps, and the server then fails to bind. The ports here come from below the
//! ephemeral range, where the kernel never places an outgoing connection, in an order of their
//! own per process, so two calls in one test binary never return the same port.

use std::net::TcpListener;
use std::ops::Range;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// How many ports below the ephemeral range the allocator walks through.
const SPAN: u16 = 16_384;

/// The lowest port it uses: below this are well-known and registered services.
const LOWEST: u16 = 10_000;

/// A loopback port that nothing listened on a moment ago and that this process has not handed
/// out before. Panics if no port in the range can be bound.
pub fn free_port() -> u16 {
    let Some(range) = range() else {
        return kernel_port();
    };
    let len = u32::from(range.end - range.start);
    for _ in 0..len {
        let n = next(len);
        let port = range.start + u16::try_from(n % len).expect("below the range's length");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {range:?}")
}

/// A loopback address that was free a moment ago, as `127.0.0.1:PORT`, for a process's
/// `--*-addr` flag.
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// Whether something accepts connections on `addr` now.
pub fn listening(addr: &str) -> bool {
    std::net::TcpStream::connect(addr).is_ok()
}

/// The next index of this process's walk: it starts at a place chosen by the process id, so
/// test binaries that run one after another mostly start apart.
fn next(len: u32) -> u32 {
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    NEXT.get_or_init(|| AtomicU32::new(std::process::id().wrapping_mul(7_919) % len))
        .fetch_add(1, Ordering::Relaxed)
}

/// The ports below the kernel's ephemeral range, or `None` if that range starts too low to
/// leave room (then the kernel's own choice is all there is).
fn range() -> Option<Range<u16>> {
    static RANGE: OnceLock<Option<Range<u16>>> = OnceLock::new();
    RANGE
        .get_or_init(|| {
            let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok();
            let low = text
                .as_deref()
                .and_then(|t| t.split_whitespace().next())
                .and_then(|t| t.parse::<u16>().ok())
                .unwrap_or(32_768);
            let start = low.saturating_sub(SPAN).max(LOWEST);
            (low > start && low - start >= 1_024).then_some(start..low)
        })
        .clone()
}

/// A port the kernel picks.
fn kernel_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        // Each port is bound as soon as it is handed out and held: other processes on the
        // machine walk the same range, so a port checked again later may be theirs by then.
        let _no_fork = crate::spawning();
        let held: Vec<(u16, TcpListener)> = (0..200)
            .map(|_| {
                let port = free_port();
                let listener = TcpListener::bind(("127.0.0.1", port)).unwrap_or_else(|e| {
                    panic!("port {port} was handed out but binds no more: {e}")
                });
                (port, listener)
            })
            .collect();
        let ports: Vec<u16> = held.iter().map(|(port, _)| *port).collect();
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), ports.len());
        if let Some(range) = range() {
            assert!(ports.iter().all(|p| range.contains(p)), "{ports:?}");
            let outgoing = std::net::TcpStream::connect(
                TcpListener::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap(),
            )
            .unwrap();
            assert!(!range.contains(&outgoing.local_addr().unwrap().port()));
        }
    }
}
