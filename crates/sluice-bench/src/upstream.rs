//! A trivial HTTP server, the baseline benchmarks compare against: it reads each request whole
//! and answers `200 ok`, over HTTP/1.1 or h2.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use tokio::net::TcpListener;

use crate::listening::{Listening, serve_each};

async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    // Read the body whole, as a real API would, so uploads cost what they cost.
    let _ = request.into_body().collect().await;
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

/// Serves the trivial answer on `listener` until shut down.
pub fn serve_trivial_upstream(listener: TcpListener) -> std::io::Result<Listening> {
    let builder = Builder::new(TokioExecutor::new());
    serve_each(listener, move |stream| {
        let connection = builder
            .serve_connection(TokioIo::new(stream), service_fn(answer))
            .into_owned();
        async move {
            let _ = connection.await;
        }
    })
}
