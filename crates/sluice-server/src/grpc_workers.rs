//! Where the gRPC service's connections are served: on a few single-threaded runtimes, one per
//! CPU the process may run on, each connection on one of them for its whole life.
//!
//! On the shared multi-threaded runtime, every h2 stream is a task of its own, and a stream
//! that finishes wakes its connection's task, which tokio runs next (the worker's LIFO slot):
//! the connection writes that one answer, then the next stream finishes and wakes it again. So
//! each answer cost its own `write`, even with many streams in flight on one connection, and a
//! connection woken that way jumped ahead of the ones waiting, which made the tail unfair
//! (issue #15: p99 at 512 in flight 2.7× Limitador's). A single-threaded runtime runs woken
//! tasks in the order they were woken: the streams a read brought in are decided one after
//! another, and their connection writes all their answers in one `write` when its turn comes.
//! Limitador serves its gRPC the same way (on actix's single-threaded runtime).
//!
//! Connections are accepted on the caller's runtime and handed out in turn. Everything the
//! service shares with the rest of the process (the limiter, its store and metrics) is
//! `Send + Sync` and does not care which runtime calls it.

use std::io;
use std::thread::JoinHandle;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::service::Routes;
use tonic::transport::Server;

/// Serves gRPC connections accepted from `listener` with `routes` on `threads` single-threaded
/// runtimes (at least one), until `stopped` turns true; then lets each finish the requests in
/// flight and returns once every runtime has stopped.
pub(crate) async fn serve(
    listener: TcpListener,
    builder: Server,
    routes: Routes,
    threads: usize,
    mut stopped: watch::Receiver<bool>,
) {
    let mut workers = Vec::new();
    let mut senders = Vec::new();
    for i in 0..threads.max(1) {
        let (send, receive) = mpsc::unbounded_channel::<std::net::TcpStream>();
        match start_worker(i, receive, builder.clone(), routes.clone(), stopped.clone()) {
            Ok(worker) => {
                workers.push(worker);
                senders.push(send);
            }
            Err(e) => tracing::error!(error = %e, "cannot start a gRPC runtime thread"),
        }
    }
    if senders.is_empty() {
        tracing::error!("no gRPC runtime thread started; the gRPC listener serves nothing");
        return;
    }
    let mut next = 0;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|s| *s) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "gRPC accept failed");
                // Out of descriptors, say: let connections close before accepting again.
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        // Registered again on the worker's runtime; still non-blocking.
        let Ok(stream) = stream.into_std() else {
            continue;
        };
        if senders[next].send(stream).is_err() {
            tracing::error!(worker = next, "a gRPC runtime thread has stopped");
        }
        next = (next + 1) % senders.len();
    }
    drop(listener);
    drop(senders);
    let _ = tokio::task::spawn_blocking(move || {
        for worker in workers {
            let _ = worker.join();
        }
    })
    .await;
}

/// A thread running one single-threaded runtime that serves the connections sent to it.
fn start_worker(
    index: usize,
    connections: mpsc::UnboundedReceiver<std::net::TcpStream>,
    builder: Server,
    routes: Routes,
    mut stopped: watch::Receiver<bool>,
) -> io::Result<JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name(format!("sluice-grpc-{index}"))
        .spawn(move || {
            runtime.block_on(async move {
                let incoming = UnboundedReceiverStream::new(connections).map(TcpStream::from_std);
                let shutdown = async move {
                    let _ = stopped.wait_for(|s| *s).await;
                };
                let mut builder = builder;
                let served = builder
                    .add_routes(routes)
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await;
                if let Err(e) = served {
                    tracing::error!(error = %e, "gRPC server failed");
                }
            });
        })
}
