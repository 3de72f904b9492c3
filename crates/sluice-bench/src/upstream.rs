//! A trivial HTTP server, the baseline benchmarks compare against: it reads each request whole
//! and answers `200 ok`, over HTTP/1.1 or h2.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running trivial server.
#[derive(Debug)]
pub struct TrivialUpstream {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl TrivialUpstream {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and waits for the accept loop to end.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    // Read the body whole, as a real API would, so uploads cost what they cost.
    let _ = request.into_body().collect().await;
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

/// Serves the trivial answer on `listener` until shut down.
pub fn serve_trivial_upstream(listener: TcpListener) -> std::io::Result<TrivialUpstream> {
    let addr = listener.local_addr()?;
    let (stop, mut stopped) = watch::channel(false);
    let task = tokio::spawn(async move {
        let builder = Builder::new(TokioExecutor::new());
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
            let connection = builder
                .serve_connection(TokioIo::new(stream), service_fn(answer))
                .into_owned();
            tokio::spawn(async move {
                let _ = connection.await;
            });
        }
    });
    Ok(TrivialUpstream { addr, stop, task })
}
