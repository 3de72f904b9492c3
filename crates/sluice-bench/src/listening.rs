//! The accept loop the bench's own servers share (the trivial upstream, the relay): each
//! connection handled on a task of its own, until the server is shut down.

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running server of the bench's own.
#[derive(Debug)]
pub struct Listening {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Listening {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and waits for the accept loop to end; open connections end with their
    /// peers.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Accepts on `listener` until shut down, each connection (with `TCP_NODELAY` set) handed to
/// `handle` on a task of its own.
pub(crate) fn serve_each<F, H>(listener: TcpListener, handle: H) -> std::io::Result<Listening>
where
    H: Fn(TcpStream) -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let addr = listener.local_addr()?;
    let (stop, mut stopped) = watch::channel(false);
    let task = tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        continue;
                    }
                },
                _ = stopped.changed() => break,
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(handle(stream));
        }
    });
    Ok(Listening { addr, stop, task })
}
