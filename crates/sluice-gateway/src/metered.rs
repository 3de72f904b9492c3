//! The gateway's service: the limit layer around forwarding, and, for a route with `usage`, a
//! reservation of its estimate instead of a check, settled with the usage its answer reports.
//!
//! Routes without `usage` go through [`SharedLimit`] exactly as before: a rule set with no
//! budgeted route costs one scan of its routes per request, and nothing is allocated for it.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::header::ACCEPT_ENCODING;
use http::{Request, Response};
use http_body_util::Either;
use sluice_http::RequestBody as ClientBody;
use sluice_http::extract::matching_route;
use sluice_http::middleware::{ResponseFuture, SharedLimitBody};
use sluice_http::settle::PendingSettle;
use sluice_http::{SharedLimit, SharedLimitLayer, pass_headers, reject};
use sluice_rules::RouteUsage;
use tower_service::Service;

use crate::GatewayBody;
use crate::budget::{UsageBody, estimate, usage_body};
use crate::forward::{Forward, RequestBody, error};

/// The body of a budgeted route's answer: the upstream's, read for its usage, or one that
/// settles nothing (the gateway's own, or an answer forwarded unlimited).
pub type BudgetBody = Either<UsageBody, GatewayBody>;

/// The body of every answer of the gateway. A budgeted route's is boxed: it carries its
/// meter (about 130 bytes), and every answer is moved whole through the layers on its way
/// out, where the common one's body is a third of that.
pub type MeteredBody = Either<SharedLimitBody<GatewayBody>, Pin<Box<BudgetBody>>>;

/// The gateway's service. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Metered {
    limited: SharedLimit<Forward>,
    budget: Arc<Budget>,
    /// The client's address when this service serves one connection ([`Metered::for_peer`]).
    peer: Option<IpAddr>,
}

/// What a budgeted request needs: the layer's extraction and limiter, and forwarding.
struct Budget {
    layer: SharedLimitLayer,
    forward: Forward,
}

impl Metered {
    pub(crate) fn new(layer: SharedLimitLayer, forward: Forward) -> Self {
        use tower_layer::Layer;
        Metered {
            limited: layer.layer(forward.clone()),
            budget: Arc::new(Budget { layer, forward }),
            peer: None,
        }
    }

    /// This service for the requests of one connection from `peer`: every layer takes the
    /// peer from here, so the listener need not add it to each request as an extension.
    pub(crate) fn for_peer(&self, peer: SocketAddr) -> Self {
        let ip = peer.ip();
        let mut limited = self.limited.for_peer(ip);
        *limited.get_mut() = self.limited.get_ref().for_peer(ip);
        Metered {
            limited,
            budget: Arc::clone(&self.budget),
            peer: Some(ip),
        }
    }
}

impl Service<Request<ClientBody>> for Metered {
    type Response = Response<MeteredBody>;
    type Error = Infallible;
    type Future = MeteredFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.limited.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ClientBody>) -> MeteredFuture {
        let reloader = self.budget.layer.enforcer().limiter().reloader();
        let usage = reloader.with_rules(|rules| {
            let gateway = rules
                .gateway()
                .filter(|g| g.routes.iter().any(|r| r.usage.is_some()))?;
            matching_route(gateway, &request).and_then(|r| r.usage.clone())
        });
        match usage {
            Some(usage) => {
                let budget = Arc::clone(&self.budget);
                let peer = self.peer;
                MeteredFuture::Budget(Box::pin(
                    async move { budget.call(request, usage, peer).await },
                ))
            }
            None => MeteredFuture::Limited(self.limited.call(request)),
        }
    }
}

/// The answer of [`Metered`]: the limit layer's, or a budgeted route's.
pub(crate) enum MeteredFuture {
    Limited(ResponseFuture<Response<SharedLimitBody<GatewayBody>>, Infallible>),
    Budget(Pin<Box<dyn Future<Output = Response<BudgetBody>> + Send>>),
}

impl Future for MeteredFuture {
    type Output = Result<Response<MeteredBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            MeteredFuture::Limited(f) => {
                let answer = ready!(f.as_mut().poll(cx));
                Poll::Ready(answer.map(|r| r.map(Either::Left)))
            }
            MeteredFuture::Budget(f) => {
                let answer = ready!(f.as_mut().poll(cx));
                Poll::Ready(Ok(answer.map(|body| Either::Right(Box::pin(body)))))
            }
        }
    }
}

impl Budget {
    /// Reserves the request's estimate, forwards it, and settles with the answer's usage.
    /// `peer` is the client's address when the service was made for its connection.
    async fn call(
        &self,
        request: Request<ClientBody>,
        usage: Arc<RouteUsage>,
        peer: Option<IpAddr>,
    ) -> Response<BudgetBody> {
        let (mut parts, body) = request.into_parts();
        let limiter = self.layer.enforcer().limiter();
        let (forward, extracted) = match peer {
            Some(ip) => (
                self.forward.for_peer(ip),
                self.layer.extract_from(&parts, ip),
            ),
            None => (self.forward.clone(), self.layer.extract(&parts)),
        };
        let Some(extracted) = extracted else {
            // The route builds no descriptor for this request: it passes unlimited, as any
            // route's would.
            return forward_unmetered(&forward, Request::from_parts(parts, Either::Left(body)))
                .await;
        };
        let (amount, body) = match estimate(&usage.reserve, &parts.headers, body).await {
            Ok(read) => read,
            Err(why) => return error(why.status(), why.detail()).map(Either::Right),
        };
        let ttl = usage.ttl.map(|t| t.min(limiter.reservation_ttls().max));
        let reserved = match limiter.reserve(&extracted.request, amount, ttl).await {
            Ok(r) => r,
            Err(e) => {
                // As a check the limiter refuses: the request passes unlimited rather than fail.
                tracing::warn!(error = %e, "request not limited: {e}");
                return forward_unmetered(&forward, Request::from_parts(parts, body)).await;
            }
        };
        if !reserved.verdict.allowed {
            return reject(&reserved.verdict, extracted.style, "limited")
                .map(|b| Either::Right(Either::Right(b)));
        }
        let headers = pass_headers(&reserved.verdict, extracted.style);
        // Admitted by `on_store_error` while the store failed: nothing was taken to settle.
        let pending = reserved
            .reservation
            .map(|id| PendingSettle::new(Arc::clone(limiter), id, amount));
        if pending.is_some() {
            // A compressed answer could not be read for its usage.
            parts.headers.remove(ACCEPT_ENCODING);
        }
        let mut response = match (
            forward.send(Request::from_parts(parts, body)).await,
            pending,
        ) {
            (Ok(answer), Some(pending)) => {
                let (head, body) = answer.into_parts();
                let body = usage_body(body, &head.headers, usage.settle.clone(), pending);
                Response::from_parts(head, Either::Left(body))
            }
            (Ok(answer), None) => answer.map(|b| Either::Right(Either::Left(b))),
            (Err(failure), pending) => {
                if let Some(pending) = pending {
                    // An upstream that never saw the request used nothing; one that may have
                    // (the connection broke, or it was late) may have used it all.
                    let used = if failure.reached_upstream() {
                        pending.reserved()
                    } else {
                        0
                    };
                    pending.settle(used).await;
                }
                failure.response().map(Either::Right)
            }
        };
        for (k, v) in headers {
            response.headers_mut().insert(k, v);
        }
        response
    }
}

/// `request` forwarded as it is, its answer not read for usage.
async fn forward_unmetered(
    forward: &Forward,
    request: Request<RequestBody>,
) -> Response<BudgetBody> {
    match forward.send(request).await {
        Ok(answer) => answer.map(|b| Either::Right(Either::Left(b))),
        Err(failure) => failure.response().map(Either::Right),
    }
}
