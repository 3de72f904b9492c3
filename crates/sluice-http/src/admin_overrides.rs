//! The admin endpoints of runtime overrides, under the admin guard of every admin endpoint
//! (loopback, or the admin token): `PUT`, `GET` and `DELETE /v1/overrides/{domain}`. The
//! engine validates and applies them (`sluice_limiter::Overrides`); these handlers read the
//! JSON, name who set an override, and answer. `docs/overrides.md` is the user's page.

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use sluice_limiter::{DescriptorEntry, OverrideError, OverridePut};

use crate::PeerAddr;
use crate::admin::{AdminState, authorize};
use crate::problem::Problem;

/// The body of `PUT /v1/overrides/{domain}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutBody {
    descriptor: Vec<DescriptorEntry>,
    rate_limit: serde_json::Value,
    #[serde(default)]
    expires: Option<String>,
}

/// The body of `DELETE /v1/overrides/{domain}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteBody {
    descriptor: Vec<DescriptorEntry>,
}

/// Reads a JSON body, or answers 400 with serde's reason (an unknown field is named).
fn read<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Problem> {
    serde_json::from_slice(body).map_err(|e| Problem::bad_request(format!("invalid JSON: {e}")))
}

/// Who changes an override, for the log and `GET`: the admin client's address, and how it
/// was let in.
fn set_by(peer: SocketAddr) -> String {
    if peer.ip().is_loopback() {
        format!("{} (loopback)", peer.ip())
    } else {
        format!("{} (admin token)", peer.ip())
    }
}

/// What an override error answers.
fn problem(e: OverrideError) -> Problem {
    match e {
        OverrideError::Invalid(reason) => Problem::bad_request(reason),
        OverrideError::NotFound(_) => Problem::new(StatusCode::NOT_FOUND, e.to_string()),
        OverrideError::Store(_) => Problem::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// Where the overrides of this instance live, in words, for every answer.
fn scope(state: &AdminState) -> &'static str {
    if state.limiter.overrides().shared() {
        "shared by every instance on the store"
    } else {
        "local to this instance: the store does not share overrides"
    }
}

/// `PUT /v1/overrides/{domain}`: sets an override, replacing any of the same descriptor.
pub(crate) async fn put(
    State(state): State<AdminState>,
    PeerAddr(peer): PeerAddr,
    headers: HeaderMap,
    Path(domain): Path<String>,
    body: Bytes,
) -> Result<Response, Problem> {
    authorize(&state, peer, &headers)?;
    let body: PutBody = read(&body)?;
    let (before, after) = state
        .limiter
        .overrides()
        .put(OverridePut {
            domain: domain.clone(),
            descriptor: body.descriptor,
            rate_limit: body.rate_limit,
            expires: body.expires,
            set_by: set_by(peer),
        })
        .await
        .map_err(problem)?;
    Ok(axum::Json(json!({
        "domain": domain,
        "scope": scope(&state),
        "before": before,
        "after": after,
    }))
    .into_response())
}

/// `GET /v1/overrides/{domain}`: every override of the domain, who set it and when, and
/// whether it applies.
pub(crate) async fn list(
    State(state): State<AdminState>,
    PeerAddr(peer): PeerAddr,
    headers: HeaderMap,
    Path(domain): Path<String>,
) -> Result<Response, Problem> {
    authorize(&state, peer, &headers)?;
    let overrides = state.limiter.overrides().list(&domain);
    if overrides.is_empty() && state.limiter.reloader().rules().domain(&domain).is_none() {
        return Err(Problem::bad_request(format!(
            "unknown domain `{domain}`; see GET /v1/rules for the domains in force"
        )));
    }
    Ok(axum::Json(json!({
        "domain": domain,
        "scope": scope(&state),
        "overrides": overrides,
    }))
    .into_response())
}

/// `DELETE /v1/overrides/{domain}` with `{"descriptor": [...]}`: removes one override.
pub(crate) async fn remove(
    State(state): State<AdminState>,
    PeerAddr(peer): PeerAddr,
    headers: HeaderMap,
    Path(domain): Path<String>,
    body: Bytes,
) -> Result<Response, Problem> {
    authorize(&state, peer, &headers)?;
    let body: DeleteBody = read(&body)?;
    let removed = state
        .limiter
        .overrides()
        .remove(&domain, &body.descriptor)
        .await
        .map_err(problem)?;
    tracing::info!(
        domain,
        by = set_by(peer),
        "runtime override removed by admin"
    );
    Ok(axum::Json(json!({
        "domain": domain,
        "scope": scope(&state),
        "removed": removed,
    }))
    .into_response())
}
