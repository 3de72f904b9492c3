//! A TCP relay that holds every byte for a fixed time in each direction: a network's round trip
//! between a client and a server on one machine, where the kernel offers no `netem` to delay
//! loopback. The benchmark of Redis Cluster puts one in front of each master, so that a
//! request's rounds to three masters take one round trip if they run at once and three if they
//! run one after another, whatever the masters' shared core does.
//!
//! Each direction of each connection is read as it arrives and written `delay` later, in order;
//! the runtime's timer fires on millisecond ticks, so a byte is held at least `delay`, and
//! about a millisecond more, or more again on a busy machine.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::listening::{Listening, serve_each};

/// Relays every connection accepted on `listener` to `to`, each byte held `delay` in each
/// direction, until shut down.
pub fn serve_relay(
    listener: TcpListener,
    to: SocketAddr,
    delay: Duration,
) -> std::io::Result<Listening> {
    serve_each(listener, move |client| async move {
        let server = match TcpStream::connect(to).await {
            Ok(server) => server,
            Err(e) => {
                tracing::warn!("cannot reach {to}: {e}");
                return;
            }
        };
        let _ = server.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        tokio::join!(
            held(client_read, server_write, delay),
            held(server_read, client_write, delay),
        );
    })
}

/// Copies `from` to `to`, each read written `delay` after it arrived, in order. At the end of
/// `from` (or an error either side) what was read is still written, then `to` is shut down.
async fn held(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (queue, mut due) = mpsc::unbounded_channel::<(Instant, Bytes)>();
    let writer = async move {
        while let Some((at, bytes)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let arrived = Instant::now();
                    if queue
                        .send((arrived + delay, Bytes::copy_from_slice(&buf[..n])))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server: what it reads, it writes back.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    /// A relay holding bytes `delay` each way in front of an echo server, and a client of it.
    async fn relayed(delay: Duration) -> (Listening, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = serve_relay(listener, echo().await, delay).unwrap();
        let client = TcpStream::connect(relay.addr()).await.unwrap();
        (relay, client)
    }

    /// A round trip through the relay takes twice its delay (and at most a tick more each
    /// way), and the bytes come back whole and in order.
    #[tokio::test(start_paused = true)]
    async fn a_round_trip_takes_twice_the_delay() {
        let (relay, mut client) = relayed(Duration::from_millis(5)).await;
        for round in 0..3u8 {
            let sent = Instant::now();
            let message = [round; 100];
            client.write_all(&message).await.unwrap();
            let mut back = [0u8; 100];
            client.read_exact(&mut back).await.unwrap();
            let took = sent.elapsed();
            assert_eq!(back, message);
            assert!(
                took >= Duration::from_millis(10) && took <= Duration::from_millis(12),
                "round {round} took {took:?}"
            );
        }
        drop(client);
        relay.shutdown().await;
    }

    /// Writes made one after another come out in that order, however the delay splits them.
    #[tokio::test(start_paused = true)]
    async fn bytes_keep_their_order() {
        let (relay, mut client) = relayed(Duration::from_millis(2)).await;
        let sent: Vec<u8> = (0..=255).collect();
        for chunk in sent.chunks(7) {
            client.write_all(chunk).await.unwrap();
            tokio::time::sleep(Duration::from_micros(300)).await;
        }
        let mut back = vec![0u8; sent.len()];
        client.read_exact(&mut back).await.unwrap();
        assert_eq!(back, sent);
        relay.shutdown().await;
    }
}
