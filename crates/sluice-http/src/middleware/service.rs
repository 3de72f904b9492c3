//! [`SharedLimit`]: the service the layer wraps around another.

use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Either, Full};
use tower_service::Service;

use super::future::ResponseFuture;
use super::layer::Shared;
use crate::enforce::Enforcement;
use crate::settle::{InFull, SettlingBody};

/// The body of a rate-limited service's answers: the inner service's, or Sluice's own
/// (a `429`, a `fake` answer). The inner service's releases the request's concurrency slot,
/// if it holds one, when it ends or is dropped.
pub type SharedLimitBody<B> = Either<SettlingBody<B, InFull>, Full<Bytes>>;

/// A service that decides each request before the inner service sees it.
pub struct SharedLimit<S> {
    inner: S,
    shared: Arc<Shared>,
    /// The client's address when this service serves one connection
    /// ([`for_peer`](SharedLimit::for_peer)).
    peer: Option<IpAddr>,
}

impl<S: Clone> Clone for SharedLimit<S> {
    fn clone(&self) -> Self {
        SharedLimit {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            peer: self.peer,
        }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for SharedLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> SharedLimit<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        SharedLimit {
            inner,
            shared,
            peer: None,
        }
    }

    /// This service for the requests of one connection from `peer`, which it then takes as
    /// the requests' peer instead of reading their `PeerAddr` (or axum's `ConnectInfo`): a
    /// listener that makes a service per connection spares every request the extension, an
    /// allocation and a map (about 500 instructions of a proxied request).
    pub fn for_peer(&self, peer: IpAddr) -> Self
    where
        S: Clone,
    {
        SharedLimit {
            peer: Some(peer),
            ..self.clone()
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for SharedLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: http_body::Body + Send + 'static,
{
    type Response = Response<SharedLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The readied service goes into the future; a fresh clone stays for the next call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        // Taken apart and its descriptors extracted here, before the future exists: the future
        // (moved whole into its box) then holds the parts once, not the request beside them.
        let (parts, body) = request.into_parts();
        let extracted = shared.extract(&parts, self.peer);
        Box::pin(async move {
            let (headers, held) = match &extracted {
                None => (Vec::new(), None),
                Some(ex) => match shared.enforcer.enforce_held(ex).await {
                    (Enforcement::Forward(headers), held) => (headers, held),
                    (Enforcement::Respond(r), _) => return Ok(r.map(Either::Right)),
                },
            };
            // A failing inner service drops `held`, which releases the slot.
            let mut response = inner.call(Request::from_parts(parts, body)).await?;
            for (k, v) in headers {
                response.headers_mut().insert(k, v);
            }
            Ok(response.map(|b| Either::Left(SettlingBody::new(b, InFull, held))))
        })
    }
}
