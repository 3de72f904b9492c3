//! Envoy's statistics sent to statsd: every flush interval, what changed since the last flush,
//! as counters (`|c`, the change) and response times (`|ms`), in UDP datagrams that each hold
//! as many whole lines as fit in [`MAX_DATAGRAM`] bytes.
//!
//! Sending is fire-and-forget from a task of its own: the collector's name is resolved and the
//! datagrams are handed to the kernel without waiting, and whatever fails (no such host, a full
//! socket buffer, nobody listening) loses that flush's datagrams and is logged once, never
//! reaching a decision. A response time that several calls took is one line with a sample
//! rate of one over their number (`12|ms|@0.25` for four calls), which statsd servers and the
//! statsd exporter count as that many calls.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use super::{EnvoyStats, LIMIT_STATS, SERVICE_STATS, StatsdTarget};

/// The largest datagram: what fits in a 1500-byte Ethernet frame after the IP and UDP headers
/// with room to spare, so that no datagram is fragmented (Envoy's statsd library sends the
/// same size). A single longer line (a very long statistics key) goes alone.
pub(super) const MAX_DATAGRAM: usize = 1432;

/// How long a flush waits for the collector's name to resolve.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// The name of the response times.
const RESPONSE_TIME: &str = "ratelimit_server.ShouldRateLimit.response_time";

/// What statsd was last sent of the service-wide counters and the response times (the
/// limits' counters keep theirs).
#[derive(Debug, Default)]
pub(super) struct Flushed {
    service: [u64; SERVICE_STATS.len()],
    response_times: BTreeMap<u64, u64>,
}

/// Sends `stats` to `target` every `every`, and once more when `stopped` turns true.
pub(crate) async fn send_every(
    stats: Arc<EnvoyStats>,
    target: StatsdTarget,
    every: Duration,
    mut stopped: watch::Receiver<bool>,
) {
    let mut sender = Sender {
        target,
        flushed: Flushed::default(),
        sockets: [None, None],
        failing: false,
    };
    let every = every.max(Duration::from_millis(1));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let last = tokio::select! {
            _ = ticker.tick() => false,
            _ = stopped.wait_for(|s| *s) => true,
        };
        sender.flush(&stats).await;
        if last {
            return;
        }
    }
}

/// The sending side: where to, what was sent, and a socket per address family.
struct Sender {
    target: StatsdTarget,
    flushed: Flushed,
    /// IPv4, IPv6; bound on first use.
    sockets: [Option<UdpSocket>; 2],
    /// The last flush failed, so the next failure is not logged again.
    failing: bool,
}

impl Sender {
    async fn flush(&mut self, stats: &EnvoyStats) {
        let result = match self.resolve().await {
            // Unresolved, nothing is taken from the counters: the next flush sends it.
            Err(e) => Err(e),
            Ok(addr) => {
                let datagrams = datagrams(stats, &mut self.flushed);
                self.send(addr, &datagrams)
            }
        };
        match result {
            Ok(()) if self.failing => {
                self.failing = false;
                tracing::info!(target = %self.address(), "statistics reach statsd again");
            }
            Ok(()) => {}
            Err(e) if !self.failing => {
                self.failing = true;
                tracing::warn!(target = %self.address(), "statistics not sent to statsd: {e}");
            }
            Err(e) => tracing::debug!("statistics not sent to statsd: {e}"),
        }
    }

    fn address(&self) -> String {
        format!("{}:{}", self.target.host, self.target.port)
    }

    /// The collector's address; an IPv4 one when the name has both, since collectors often
    /// listen on IPv4 alone (`localhost` is both).
    async fn resolve(&self) -> Result<SocketAddr, String> {
        let lookup = tokio::net::lookup_host((self.target.host.as_str(), self.target.port));
        let addrs: Vec<SocketAddr> = tokio::time::timeout(RESOLVE_TIMEOUT, lookup)
            .await
            .map_err(|_| "the name did not resolve in time".to_owned())?
            .map_err(|e| e.to_string())?
            .collect();
        addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or(addrs.first())
            .copied()
            .ok_or_else(|| "the name has no address".to_owned())
    }

    /// Hands `datagrams` to the kernel on a non-blocking socket: a send never waits, and a
    /// datagram the kernel cannot take at once is dropped.
    fn send(&mut self, addr: SocketAddr, datagrams: &[Vec<u8>]) -> Result<(), String> {
        let family = usize::from(addr.is_ipv6());
        if self.sockets[family].is_none() {
            let any = if addr.is_ipv6() {
                SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0))
            } else {
                SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
            };
            let socket = UdpSocket::bind(any).map_err(|e| e.to_string())?;
            socket.set_nonblocking(true).map_err(|e| e.to_string())?;
            self.sockets[family] = Some(socket);
        }
        let Some(socket) = &self.sockets[family] else {
            return Ok(());
        };
        let mut failed = None;
        for datagram in datagrams {
            if let Err(e) = socket.send_to(datagram, addr) {
                failed = Some(e.to_string());
            }
        }
        failed.map_or(Ok(()), Err)
    }
}

/// The datagrams of what changed since `flushed`, which is brought up to date.
pub(super) fn datagrams(stats: &EnvoyStats, flushed: &mut Flushed) -> Vec<Vec<u8>> {
    let mut out = Datagrams::default();
    let mut line = Vec::with_capacity(256);
    let tags = stats.tags.as_bytes();
    {
        let limits = stats
            .limits
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (key, counters) in limits.iter() {
            for (i, stat) in LIMIT_STATS.iter().enumerate() {
                let now = counters.counts[i].load(Ordering::Relaxed);
                let change = now.saturating_sub(counters.flushed[i].swap(now, Ordering::Relaxed));
                if change > 0 {
                    line.clear();
                    line.extend_from_slice(b"ratelimit.service.rate_limit.");
                    line.extend_from_slice(key.as_bytes());
                    line.push(b'.');
                    line.extend_from_slice(stat.as_bytes());
                    line.extend_from_slice(tags);
                    let _ = writeln!(line, ":{change}|c");
                    out.push(&line);
                }
            }
        }
    }
    for ((name, now), sent) in SERVICE_STATS
        .iter()
        .zip(stats.service_totals())
        .zip(&mut flushed.service)
    {
        let change = now.saturating_sub(std::mem::replace(sent, now));
        if change > 0 {
            line.clear();
            line.extend_from_slice(name.as_bytes());
            line.extend_from_slice(tags);
            let _ = writeln!(line, ":{change}|c");
            out.push(&line);
        }
    }
    for (ms, total) in stats.response_times.totals() {
        let calls = total.saturating_sub(flushed.response_times.insert(ms, total).unwrap_or(0));
        if calls > 0 {
            line.clear();
            line.extend_from_slice(RESPONSE_TIME.as_bytes());
            line.extend_from_slice(tags);
            let _ = write!(line, ":{ms}|ms");
            if calls > 1 {
                let _ = write!(line, "|@{}", sample_rate(calls));
            }
            line.push(b'\n');
            out.push(&line);
        }
    }
    out.finish()
}

/// The sample rate that a reader multiplies back into `calls` samples: one over `calls`, as
/// the shortest decimal that reads back as the same double, made a little smaller when need
/// be so that one over it is not below `calls` (the statsd exporter truncates it).
fn sample_rate(calls: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let n = calls as f64;
    let mut rate = 1.0 / n;
    while 1.0 / rate < n {
        rate = f64::from_bits(rate.to_bits() - 1);
    }
    rate
}

/// Lines gathered into datagrams of at most [`MAX_DATAGRAM`] bytes.
#[derive(Default)]
struct Datagrams {
    done: Vec<Vec<u8>>,
    current: Vec<u8>,
}

impl Datagrams {
    /// Adds a whole line, its newline included.
    fn push(&mut self, line: &[u8]) {
        if !self.current.is_empty() && self.current.len() + line.len() > MAX_DATAGRAM {
            self.done.push(std::mem::take(&mut self.current));
        }
        self.current.extend_from_slice(line);
    }

    fn finish(mut self) -> Vec<Vec<u8>> {
        if !self.current.is_empty() {
            self.done.push(self.current);
        }
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_fill_datagrams_without_being_cut() {
        let mut d = Datagrams::default();
        let line = [b'x'; 99];
        for _ in 0..40 {
            let mut l = line.to_vec();
            l.push(b'\n');
            d.push(&l);
        }
        let long = vec![b'y'; 2000];
        d.push(&long);
        let out = d.finish();
        // 14 lines of 100 bytes per datagram, then the rest, then the long line alone.
        assert_eq!(
            out.iter().map(Vec::len).collect::<Vec<_>>(),
            [1400, 1400, 1200, 2000]
        );
    }

    #[test]
    fn a_sample_rate_reads_back_as_its_number_of_calls() {
        for calls in (2..100_000).chain([1 << 20, 999_999_937]) {
            let rate = sample_rate(calls);
            let read: f64 = rate.to_string().parse().unwrap();
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let multiplied = (1.0 / read) as u64;
            assert_eq!(multiplied, calls, "{rate}");
        }
    }
}
