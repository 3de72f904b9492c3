//! What a front end does with a verdict: the rules' actions, the rate-limit fields, and the
//! bounded queue that `delay` waits in. The gateway and the tower layer both end here, so they
//! answer alike.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};
use http_body_util::Full;
use sluice_core::Decision;
use sluice_rules::Action;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use sluice_limiter::{HeaderStyle, LimitResult, Limiter, Verdict, retry_after_secs};

use crate::extract::Extracted;
use crate::settle::PendingSettle;

/// The IETF problem type for a request over its quota.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// How many requests may wait in `delay` at once by default. Past it, a request that would wait
/// is rejected, so a flood cannot hold unbounded connections and memory.
pub const DEFAULT_MAX_DELAYED: usize = 1024;

/// What to do with a request once its limits are decided.
#[derive(Debug)]
pub enum Enforcement {
    /// Let it through, adding these fields to the upstream's answer.
    Forward(Vec<(HeaderName, HeaderValue)>),
    /// Answer with this instead; the upstream never sees the request.
    Respond(Response<Full<Bytes>>),
}

/// Turns verdicts into actions. Cheap to clone: clones share the limiter and the delay queue.
#[derive(Debug, Clone)]
pub struct Enforcer {
    limiter: Arc<Limiter>,
    /// Places in the delay queue. A waiting request holds one; dropping its future (the client
    /// went away) gives it back.
    waiting: Arc<Semaphore>,
}

impl Enforcer {
    /// An enforcer over `limiter`, with at most `max_delayed` requests waiting at once.
    pub fn new(limiter: Arc<Limiter>, max_delayed: usize) -> Self {
        Enforcer {
            limiter,
            waiting: Arc::new(Semaphore::new(max_delayed)),
        }
    }

    /// The limiter.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// Free places in the delay queue.
    pub fn free_delay_places(&self) -> usize {
        self.waiting.available_permits()
    }

    /// [`Enforcer::enforce`], or, when `ex`'s domain has a concurrency limit, a reservation of
    /// the request's cost that holds its slot: the [`PendingSettle`] to settle when the answer
    /// ends or is dropped (with [`crate::settle::SettlingBody`]), which releases the slot. A
    /// refused reservation is answered as `reject` answers, whatever the limit's action: a slot
    /// is not waited for, since nothing tells when one comes back. A reservation admitted by a
    /// rule's `on_store_error` while the store failed holds nothing, and settles nothing.
    pub async fn enforce_held(&self, ex: &Extracted) -> (Enforcement, Option<PendingSettle>) {
        if !self
            .limiter
            .reloader()
            .with_rules(|rules| rules.limits_concurrency(&ex.request.domain))
        {
            return (self.enforce(ex).await, None);
        }
        let amount = ex.request.cost.max(1);
        // On the heap: a reservation's future is large (880 bytes), and would otherwise make
        // every request's future larger by as much, which is copied whole into its box.
        let reserved = match Box::pin(self.limiter.reserve(&ex.request, amount, None)).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "request not limited: {e}");
                return (Enforcement::Forward(Vec::new()), None);
            }
        };
        log_shadow(&ex.request.domain, &reserved.verdict);
        if !reserved.verdict.allowed {
            let refusal = reject(&reserved.verdict, ex.style, "limited");
            return (Enforcement::Respond(refusal), None);
        }
        let pending = reserved
            .reservation
            .map(|id| PendingSettle::new(Arc::clone(&self.limiter), id, amount));
        let headers = pass_headers(&reserved.verdict, ex.style);
        (Enforcement::Forward(headers), pending)
    }

    /// Decides `ex` and applies the actions: waits for `delay`, and answers `reject` and `fake`
    /// itself.
    pub async fn enforce(&self, ex: &Extracted) -> Enforcement {
        let mut deadline: Option<Instant> = None;
        let mut place: Option<OwnedSemaphorePermit> = None;
        loop {
            let verdict = match self.limiter.decide(&ex.request).await {
                Ok(v) => v,
                Err(e) => {
                    // Extraction keeps requests within the limiter's bounds; should a route
                    // still build one it refuses, the request passes unlimited rather than fail.
                    tracing::warn!(error = %e, "request not limited: {e}");
                    return Enforcement::Forward(Vec::new());
                }
            };
            log_shadow(&ex.request.domain, &verdict);
            if verdict.allowed {
                let delay = verdict
                    .limits
                    .iter()
                    .filter(|c| c.enforced())
                    .map(|c| c.decision.delay)
                    .max()
                    .unwrap_or_default();
                if !delay.is_zero() {
                    // The shaper already gave this request its slot; it only has to wait.
                    if place.is_none() {
                        place = self.waiting.clone().try_acquire_owned().ok();
                    }
                    if place.is_none() {
                        return Enforcement::Respond(reject(&verdict, ex.style, "queue_full"));
                    }
                    tokio::time::sleep(delay).await;
                }
                return Enforcement::Forward(pass_headers(&verdict, ex.style));
            }
            let denied: Vec<&LimitResult> = verdict.refusing().collect();
            if let Some(fake) = denied.iter().find_map(|c| match &c.rule.action {
                Action::Fake {
                    status,
                    content_type,
                    body,
                } => Some((*status, content_type, body)),
                _ => None,
            }) {
                return Enforcement::Respond(fake_response(fake.0, fake.1, fake.2));
            }
            if let Some(wait) = delay_wait(&denied) {
                let now = Instant::now();
                let deadline = *deadline.get_or_insert(now + wait.max_wait);
                if now + wait.retry <= deadline {
                    if place.is_none() {
                        place = self.waiting.clone().try_acquire_owned().ok();
                    }
                    if place.is_some() {
                        tokio::time::sleep(wait.retry).await;
                        continue;
                    }
                }
            }
            return Enforcement::Respond(reject(&verdict, ex.style, "limited"));
        }
    }
}

/// How long a request whose every denial has the `delay` action should wait, and for how long
/// it may wait in all.
struct DelayWait {
    retry: Duration,
    max_wait: Duration,
}

fn delay_wait(denied: &[&LimitResult]) -> Option<DelayWait> {
    let mut retry = Duration::ZERO;
    let mut max_wait = Duration::MAX;
    for c in denied {
        let Action::Delay { max_wait: m } = &c.rule.action else {
            return None;
        };
        if c.decision.retry_after == Decision::NEVER {
            return None;
        }
        retry = retry.max(c.decision.retry_after);
        // Without a `max_wait` of its own, a request waits at most one window or one period of
        // the rate.
        max_wait = max_wait.min(m.unwrap_or_else(|| c.policy().requests_per().1));
    }
    (!denied.is_empty()).then_some(DelayWait { retry, max_wait })
}

fn log_shadow(domain: &str, verdict: &Verdict) {
    for c in verdict
        .limits
        .iter()
        .filter(|c| !c.enforced() && !c.decision.allowed)
    {
        tracing::info!(domain, rule = %c.name(), key = %c.key, "shadow or soft limit exceeded; request passed");
    }
}

/// The fields of a request that passes: the rate-limit fields without `Retry-After`, and the
/// warning of any `soft` limit it went over. Public so that the gateway's reservations answer
/// with the same fields as its checks.
pub fn pass_headers(verdict: &Verdict, style: HeaderStyle) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = verdict.headers(style);
    out.retain(|(k, _)| k != RETRY_AFTER);
    for c in verdict.limits.iter().filter(|c| !c.decision.allowed) {
        let Action::Soft { header } = &c.rule.action else {
            continue;
        };
        let name = HeaderName::from_bytes(header.as_bytes())
            .unwrap_or_else(|_| HeaderName::from_static("x-ratelimit-warning"));
        let mut value = format!("limit \"{}\" exceeded", sanitize(c.name()));
        if let Some(secs) = retry_after_secs(&c.decision) {
            value.push_str(&format!("; retry after {secs}s"));
        }
        if let Ok(v) = HeaderValue::from_str(&value) {
            out.push((name, v));
        }
    }
    out
}

/// A name fit for a header value or JSON string: printable ASCII without quotes.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ' '..='~' if c != '"' && c != '\\' => c,
            _ => '?',
        })
        .collect()
}

/// `429 Too Many Requests` with the rate-limit fields, `Retry-After` and an
/// `application/problem+json` body naming the violated policies.
pub fn reject(verdict: &Verdict, style: HeaderStyle, why: &str) -> Response<Full<Bytes>> {
    let violated: Vec<&str> = verdict.refusing().map(LimitResult::name).collect();
    let retry = verdict.retry_after_secs();
    let detail = match (why, retry) {
        ("queue_full", _) => {
            "the request would have waited its turn, but the delay queue is full".to_owned()
        }
        (_, Some(secs)) => format!("quota exceeded; retry in {secs} s"),
        (_, None) => "quota exceeded; this request cannot pass at any rate".to_owned(),
    };
    let body = serde_json::json!({
        "type": QUOTA_EXCEEDED,
        "title": "Too Many Requests",
        "status": 429,
        "detail": detail,
        "violated-policies": violated,
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    for (k, v) in verdict.headers(style) {
        headers.insert(k, v);
    }
    response
}

/// The canned answer of a `fake` limit. It carries no rate-limit fields, so that it looks like
/// any other answer.
fn fake_response(status: u16, content_type: &str, body: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::copy_from_slice(body.as_bytes())));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let ct = HeaderValue::from_str(content_type)
        .unwrap_or_else(|_| HeaderValue::from_static("text/plain; charset=utf-8"));
    response.headers_mut().insert(CONTENT_TYPE, ct);
    response
}
