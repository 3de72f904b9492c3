//! The live dashboard: `GET /dashboard`, a page embedded in the binary (no script or style from
//! anywhere else), and `GET /v1/dashboard`, the JSON it polls once a second.
//!
//! The page itself holds no data, so it is served to anyone; the data is an admin endpoint,
//! answering loopback peers, or others with the admin token (which the page sends when its URL
//! carries `#token=…`).

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use sluice_limiter::Limiter;
use sluice_limiter::activity::{History, now_ms};

use crate::PeerAddr;
use crate::admin::{AdminState, authorize, rules_json};
use crate::problem::Problem;

/// The page, compiled in.
const PAGE: &str = include_str!("dashboard.html");

/// How many of the most limited counters the dashboard lists.
const TOP_KEYS: usize = 10;

pub(crate) async fn page() -> Response {
    let mut response = PAGE.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // Nothing but this page's own inline script and style, and fetches to this origin.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src 'self' data:",
        ),
    );
    response
}

pub(crate) async fn data(
    State(state): State<AdminState>,
    PeerAddr(peer): PeerAddr,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    authorize(&state, peer, &headers)?;
    Ok(axum::Json(snapshot(&state.limiter)).into_response())
}

/// Everything the dashboard shows, now.
pub(crate) fn snapshot(limiter: &Limiter) -> Value {
    let stats = limiter.reloader().stats();
    let reloads: Vec<Value> = limiter
        .reload_log()
        .records()
        .into_iter()
        .map(|r| json!({ "at_ms": r.at_ms, "outcome": r.outcome, "detail": r.detail }))
        .collect();
    let top: Vec<Value> = limiter
        .metrics()
        .top_limited(TOP_KEYS)
        .into_iter()
        .map(|(key, refusals)| json!({ "key": key, "refusals": refusals }))
        .collect();
    json!({
        "now_ms": now_ms(),
        "decisions": decisions(&limiter.history().history()),
        "top_limited": top,
        "store": {
            "kind": if limiter.breaker().is_some() { "redis" } else { "memory" },
            "breaker": limiter.breaker().map(|b| b.name()),
            "tracked_keys": limiter.store().tracked_keys(),
            "errors": limiter.metrics().store_errors(),
        },
        "rules": rules_json(limiter),
        "reloads": {
            "reloaded": stats.reloads.load(std::sync::atomic::Ordering::Relaxed),
            "failed": stats.failures.load(std::sync::atomic::Ordering::Relaxed),
            "recent": reloads,
        },
    })
}

/// Each series' decisions per sample interval: the difference of consecutive totals.
fn decisions(history: &History) -> Value {
    let at: Vec<u64> = history.samples.iter().skip(1).map(|s| s.at_ms).collect();
    let series: Vec<Value> = history
        .series
        .iter()
        .enumerate()
        .map(|(i, (domain, rule, outcome))| {
            let total = |k: usize| history.samples[k].totals.get(i).copied().unwrap_or(0);
            let per: Vec<u64> = (1..history.samples.len())
                .map(|k| total(k).saturating_sub(total(k - 1)))
                .collect();
            json!({
                "domain": domain,
                "rule": rule,
                "outcome": outcome.name(),
                "total": history.samples.last().map_or(0, |_| total(history.samples.len() - 1)),
                "per_interval": per,
            })
        })
        .collect();
    json!({ "at_ms": at, "series": series })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_limiter::Outcome;
    use sluice_limiter::activity::Sample;

    #[test]
    fn totals_become_decisions_per_interval_and_late_series_start_at_zero() {
        let history = History {
            series: vec![
                ("d".into(), "a".into(), Outcome::Allowed),
                ("d".into(), "a".into(), Outcome::Limited),
            ],
            samples: vec![
                Sample {
                    at_ms: 1000,
                    totals: vec![5],
                },
                Sample {
                    at_ms: 2000,
                    totals: vec![9],
                },
                Sample {
                    at_ms: 3000,
                    totals: vec![9, 4],
                },
            ],
        };
        let v = decisions(&history);
        assert_eq!(v["at_ms"], json!([2000, 3000]));
        assert_eq!(v["series"][0]["per_interval"], json!([4, 0]));
        assert_eq!(v["series"][0]["total"], json!(9));
        assert_eq!(v["series"][1]["per_interval"], json!([0, 4]));
        assert_eq!(v["series"][1]["outcome"], json!("limited"));
    }
}
