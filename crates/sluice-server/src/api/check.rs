//! Sluice's `/v1/check`: one decision per limit, per descriptor, the limit each descriptor's
//! status describes, and the headers a gateway would set. Unlike Envoy's `/json`, it keeps the
//! true remainder of every limit, shadow ones included.

use axum::body::Body;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use sluice_core::ReservationId;
use sluice_http::problem::Problem;
use sluice_limiter::Verdict;

use super::json_out::{boolean, description, key, secs, string, uint, word};
use super::{ApiBody, ApiState, decide, status_of};

/// `POST /v1/check`.
pub(super) async fn answer(state: &ApiState, body: impl ApiBody) -> Result<Response, Problem> {
    let super::Decided {
        request, verdict, ..
    } = decide(state, body).await?;
    let headers = verdict.headers(state.headers);
    let body = verdict_json(request.descriptors.len(), &verdict, &headers, None);
    Ok(json_answer(status_of(&verdict), body, headers))
}

/// What `/v1/reserve` adds to a verdict's body.
pub(super) struct ReservationFields {
    /// The units asked for.
    pub(super) amount: u64,
    /// The reservation to settle; `None` (`null`) when nothing was taken.
    pub(super) reservation: Option<ReservationId>,
    /// How long it holds.
    pub(super) ttl: std::time::Duration,
    /// Admitted by `on_store_error` with nothing taken: there is nothing to settle, and the
    /// answer says so (`admitted_without_store`).
    pub(super) without_store: bool,
}

/// A verdict as `/v1/check` answers it, on a request of `descriptors` descriptors: whether it
/// is allowed, each descriptor's limits and status, and the rate-limit `headers`, which the body
/// repeats under `headers`; with `/v1/reserve`'s fields when given. Keys are in the order
/// serde_json's map kept them (sorted), so the body is byte for byte what it was when it was
/// built as a `serde_json::Value`.
pub(super) fn verdict_json(
    descriptors: usize,
    verdict: &Verdict,
    headers: &[(HeaderName, HeaderValue)],
    reservation: Option<&ReservationFields>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(160 + 448 * verdict.limits.len() + 96 * headers.len());
    out.push(b'{');
    if reservation.is_some_and(|r| r.without_store) {
        key(&mut out, "admitted_without_store");
        out.extend_from_slice(b"true,");
    }
    key(&mut out, "allowed");
    boolean(&mut out, verdict.allowed);
    if let Some(r) = reservation {
        out.push(b',');
        key(&mut out, "amount");
        uint(&mut out, r.amount);
    }
    out.push(b',');
    key(&mut out, "descriptors");
    out.push(b'[');
    for i in 0..descriptors {
        if i > 0 {
            out.push(b',');
        }
        descriptor_json(&mut out, verdict, i);
    }
    out.extend_from_slice(b"],");
    key(&mut out, "headers");
    headers_json(&mut out, headers);
    if let Some(r) = reservation {
        out.push(b',');
        key(&mut out, "reservation");
        match r.reservation {
            // An id is `rsv_` and hex digits: nothing to escape.
            Some(id) => {
                out.push(b'"');
                out.extend_from_slice(&id.to_ascii());
                out.push(b'"');
            }
            None => out.extend_from_slice(b"null"),
        }
        out.push(b',');
        key(&mut out, "ttl");
        secs(&mut out, r.ttl);
    }
    out.push(b'}');
    out
}

/// Descriptor `i`: whether it is allowed, whether it is unlimited, the tightest limit, and each
/// limit's decision.
fn descriptor_json(out: &mut Vec<u8>, verdict: &Verdict, i: usize) {
    let status = verdict.status(i);
    out.push(b'{');
    key(out, "allowed");
    boolean(out, !status.refused);
    out.push(b',');
    key(out, "limits");
    out.push(b'[');
    for (n, c) in verdict.for_descriptor(i).enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.push(b'{');
        key(out, "action");
        word(out, c.rule.action.name());
        out.push(b',');
        key(out, "algorithm");
        word(out, c.policy().algorithm().name());
        out.push(b',');
        key(out, "allowed");
        boolean(out, c.decision.allowed);
        out.push(b',');
        key(out, "delay");
        secs(out, c.decision.delay);
        out.push(b',');
        key(out, "description");
        description(out, c.policy());
        out.push(b',');
        key(out, "key");
        string(out, &c.key);
        out.push(b',');
        key(out, "limit");
        uint(out, c.decision.limit);
        out.push(b',');
        key(out, "name");
        string(out, c.name());
        out.push(b',');
        key(out, "outcome");
        word(out, c.outcome.name());
        out.push(b',');
        key(out, "remaining");
        uint(out, c.decision.remaining);
        out.push(b',');
        key(out, "reset_after");
        secs(out, c.decision.reset_after);
        out.push(b',');
        key(out, "retry_after");
        secs(out, c.decision.retry_after);
        out.push(b',');
        key(out, "window");
        super::json_out::float(out, c.policy().window().as_secs_f64());
        out.push(b'}');
    }
    out.extend_from_slice(b"],");
    key(out, "tightest");
    match status.limit {
        Some(c) => string(out, c.name()),
        None => out.extend_from_slice(b"null"),
    }
    out.push(b',');
    key(out, "unlimited");
    boolean(out, verdict.unlimited.contains(&i));
    out.push(b'}');
}

/// The headers as an object, by name: sorted, and the last of a repeated name, as a map keeps
/// them.
fn headers_json(out: &mut Vec<u8>, headers: &[(HeaderName, HeaderValue)]) {
    let mut sorted: Vec<&(HeaderName, HeaderValue)> = headers.iter().collect();
    // Stable, so that of a repeated name the last sent stays last.
    sorted.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    out.push(b'{');
    let mut first = true;
    for (i, (name, value)) in sorted.iter().map(|h| (&h.0, &h.1)).enumerate() {
        if sorted.get(i + 1).is_some_and(|next| next.0 == *name) {
            continue;
        }
        if !first {
            out.push(b',');
        }
        first = false;
        word(out, name.as_str());
        out.push(b':');
        string(out, value.to_str().unwrap_or_default());
    }
    out.push(b'}');
}

/// A JSON answer: `status`, `body`, and the rate-limit `headers` after the content type.
/// Built as the response it is, with its one content type: axum's `(status, headers, body)`
/// first gives the body its own (`application/octet-stream`) and then replaces it, two hash
/// map insertions where one does (about 300 instructions of a `/json` answer).
pub(super) fn json_answer(
    status: StatusCode,
    body: Vec<u8>,
    headers: Vec<(HeaderName, HeaderValue)>,
) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    let fields = response.headers_mut();
    fields.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    fields.extend(headers);
    response
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use serde_json::{Map, Value, json};
    use sluice_core::MemoryStore;
    use sluice_http::admin::secs;
    use sluice_limiter::{HeaderStyle, LimitRequest, Limiter, Metrics, RequestDescriptor};
    use sluice_rules::Reloader;

    use super::*;

    /// The body as it was built before it was written directly: a `serde_json::Value`.
    fn as_value(
        descriptors: usize,
        verdict: &Verdict,
        headers: &[(HeaderName, HeaderValue)],
        reservation: Option<&ReservationFields>,
    ) -> Vec<u8> {
        let descriptors: Vec<Value> = (0..descriptors)
            .map(|i| {
                let limits: Vec<Value> = verdict
                    .for_descriptor(i)
                    .map(|c| {
                        json!({
                            "name": c.name(),
                            "key": c.key,
                            "algorithm": c.policy().algorithm().name(),
                            "outcome": c.outcome.name(),
                            "allowed": c.decision.allowed,
                            "limit": c.decision.limit,
                            "remaining": c.decision.remaining,
                            "window": c.policy().window().as_secs_f64(),
                            "description": c.policy().to_string(),
                            "reset_after": secs(c.decision.reset_after),
                            "retry_after": secs(c.decision.retry_after),
                            "delay": secs(c.decision.delay),
                            "action": c.rule.action.name(),
                        })
                    })
                    .collect();
                let status = verdict.status(i);
                json!({
                    "allowed": !status.refused,
                    "unlimited": verdict.unlimited.contains(&i),
                    "tightest": status.limit.map(|c| c.name()),
                    "limits": limits,
                })
            })
            .collect();
        let header_json: Map<String, Value> = headers
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), json!(v.to_str().unwrap_or_default())))
            .collect();
        let mut body = Map::new();
        body.insert("allowed".into(), json!(verdict.allowed));
        body.insert("descriptors".into(), Value::Array(descriptors));
        body.insert("headers".into(), Value::Object(header_json));
        if let Some(r) = reservation {
            body.insert(
                "reservation".into(),
                r.reservation
                    .map_or(Value::Null, |id| json!(id.to_string())),
            );
            body.insert("amount".into(), json!(r.amount));
            body.insert("ttl".into(), secs(r.ttl));
            if r.without_store {
                body.insert("admitted_without_store".into(), json!(true));
            }
        }
        serde_json::to_vec(&Value::Object(body)).unwrap()
    }

    fn descriptor(entries: &[(&str, &str)]) -> RequestDescriptor {
        RequestDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            ..Default::default()
        }
    }

    /// Allowed and refused, shadow, several limits on one descriptor, an unlimited one, one no
    /// rule matches, names that need escaping, and every header style: written directly, each
    /// body is byte for byte the one serde_json wrote from a `Value`.
    #[tokio::test]
    async fn the_body_is_what_serde_json_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        std::fs::write(
            &path,
            r#"
domain: d
descriptors:
  - key: user
    rate_limit: {name: "per \"user\"\n", unit: minute, requests_per_unit: 2}
  - key: plan
    value: free
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra}
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_counter}
  - key: watch
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}
  - key: vip
    rate_limit: {unlimited: true}
"#,
        )
        .unwrap();
        let limiter = Limiter::new(
            Reloader::new(vec![path]).unwrap(),
            Arc::new(MemoryStore::new()),
            Arc::new(Metrics::new()),
        );
        let request = LimitRequest {
            domain: "d".into(),
            descriptors: vec![
                descriptor(&[("user", "a\u{1}\"b")]),
                descriptor(&[("plan", "free"), ("user", "x")]),
                descriptor(&[("watch", "w")]),
                descriptor(&[("vip", "v")]),
                descriptor(&[("nothing", "n")]),
            ],
            cost: 1,
        };
        let mut seen_refused = false;
        for round in 0..4 {
            let verdict = limiter.decide(&request).await.unwrap();
            seen_refused |= !verdict.allowed;
            for style in [
                HeaderStyle::Ietf,
                HeaderStyle::None,
                HeaderStyle::Legacy,
                HeaderStyle::Both,
            ] {
                let headers = verdict.headers(style);
                let n = request.descriptors.len();
                assert_eq!(
                    String::from_utf8(verdict_json(n, &verdict, &headers, None)).unwrap(),
                    String::from_utf8(as_value(n, &verdict, &headers, None)).unwrap(),
                    "round {round}, {style:?}"
                );
                let fields = ReservationFields {
                    amount: 7,
                    reservation: (round % 2 == 0).then(|| ReservationId::from_u128(round)),
                    ttl: Duration::from_millis(1_500),
                    without_store: round % 3 == 1,
                };
                assert_eq!(
                    String::from_utf8(verdict_json(n, &verdict, &headers, Some(&fields))).unwrap(),
                    String::from_utf8(as_value(n, &verdict, &headers, Some(&fields))).unwrap(),
                );
            }
        }
        assert!(seen_refused, "the rules refuse by the last round");
    }
}
