//! Sluice's `/v1/reserve` and `/v1/settle`: usage known only afterwards. A reservation takes
//! `amount` from every enforced limit of a `/v1/check` request at once, all or none; a settle
//! gives back what was not used, or charges what was used beyond it. See `docs/usage-limits.md`.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use sluice_http::admin::secs;
use sluice_http::problem::Problem;
use sluice_limiter::{InvalidReservation, SettleRefused};

use super::check::verdict_json;
use super::json_request::JsonRequest;
use super::{ApiBody, ApiState, body_text, collect_body, parse_json, status_of};

/// `POST /v1/reserve`.
pub(super) async fn reserve(state: &ApiState, body: impl ApiBody) -> Result<Response, Problem> {
    let bytes = collect_body(body).await?;
    let text = body_text(&bytes)?;
    let mut fields: Map<String, Value> = parse_json(text)?;
    let amount = amount(fields.remove("amount"))?;
    let ttl = ttl(fields.remove("ttl"))?;
    let json: JsonRequest =
        serde_path_to_error::deserialize(Value::Object(fields)).map_err(|e| {
            Problem::bad_request(format!("invalid JSON: {}", e.inner()))
                .with_field(e.path().to_string())
        })?;
    let (request, sent_cost) = json.into_limit_request()?;
    if sent_cost > 0 {
        return Err(Problem::bad_request(
            "a reservation takes `amount` from every limit; leave out `cost` and `hits_addend`",
        )
        .with_field("cost"));
    }
    if let Some(i) = request.descriptors.iter().position(|d| d.cost.is_some()) {
        return Err(Problem::bad_request(
            "a reservation takes `amount` from every limit; a descriptor cannot have its own",
        )
        .with_field(format!("descriptors[{i}].cost")));
    }
    let reserved = state
        .limiter
        .reserve(&request, amount, ttl)
        .await
        .map_err(|e| {
            let field = match &e {
                InvalidReservation::Unsupported(why) => {
                    return Problem::new(StatusCode::NOT_IMPLEMENTED, why.clone());
                }
                InvalidReservation::Request(_) => None,
                InvalidReservation::ZeroAmount | InvalidReservation::AmountTooLarge(_) => {
                    Some("amount")
                }
                InvalidReservation::ZeroTtl | InvalidReservation::TtlTooLong { .. } => Some("ttl"),
            };
            let problem = Problem::bad_request(e.to_string());
            match field {
                Some(f) => problem.with_field(f),
                None => problem,
            }
        })?;
    let (mut body, headers) = verdict_json(state, &request, &reserved.verdict);
    body.insert(
        "reservation".into(),
        reserved
            .reservation
            .map_or(Value::Null, |id| json!(id.to_string())),
    );
    if reserved.verdict.allowed && reserved.store_failed {
        // Admitted by `on_store_error` with nothing taken: there is nothing to settle.
        body.insert("admitted_without_store".into(), json!(true));
    }
    body.insert("amount".into(), json!(amount));
    body.insert("ttl".into(), json!(secs(reserved.ttl)));
    let mut response = (
        status_of(&reserved.verdict),
        axum::Json(Value::Object(body)),
    )
        .into_response();
    response.headers_mut().extend(headers);
    Ok(response)
}

/// The body `/v1/settle` takes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleBody {
    reservation: String,
    used: Value,
}

/// `POST /v1/settle`.
pub(super) async fn settle(state: &ApiState, body: impl ApiBody) -> Result<Response, Problem> {
    let bytes = collect_body(body).await?;
    let text = body_text(&bytes)?;
    let SettleBody { reservation, used } = parse_json(text)?;
    // Anything but a whole number; one too large is refused below, in the limiter's words.
    let used = whole_number(&used).ok_or_else(|| {
        Problem::bad_request(format!(
            "`used` is {used}; send the units used, a whole number from 0 to {}",
            u32::MAX
        ))
        .with_field("used")
    })?;
    let settled = state
        .limiter
        .settle_named(&reservation, used)
        .await
        .map_err(|refused| {
            let (status, field) = match &refused {
                SettleRefused::UsedTooLarge(_) => (StatusCode::BAD_REQUEST, Some("used")),
                SettleRefused::Unknown(_) => (StatusCode::NOT_FOUND, Some("reservation")),
                SettleRefused::AlreadySettled => (StatusCode::CONFLICT, Some("reservation")),
                SettleRefused::Expired => (StatusCode::GONE, Some("reservation")),
                SettleRefused::StoreFailed(_) => (StatusCode::SERVICE_UNAVAILABLE, None),
                SettleRefused::Unsupported(_) => (StatusCode::NOT_IMPLEMENTED, None),
            };
            let problem = Problem::new(status, refused.to_string());
            match field {
                Some(f) => problem.with_field(f),
                None => problem,
            }
        })?;
    Ok(axum::Json(json!({
        "reservation": reservation,
        "settled": true,
        "reserved": settled.reserved,
        "used": settled.used,
        "refunded": settled.refunded,
        "charged": settled.charged,
    }))
    .into_response())
}

/// `amount`: required, a whole number; [`sluice_limiter::Limiter::reserve`] checks its range.
fn amount(value: Option<Value>) -> Result<u64, Problem> {
    let value = value.ok_or_else(|| {
        Problem::bad_request("`amount` is missing; send the units to reserve").with_field("amount")
    })?;
    whole_number(&value).ok_or_else(|| {
        Problem::bad_request(format!(
            "`amount` is {value}; send a whole number from 1 to {}",
            u32::MAX
        ))
        .with_field("amount")
    })
}

/// `ttl`: optional; a duration such as `"30s"` or `"5m"`, or a number of seconds.
fn ttl(value: Option<Value>) -> Result<Option<Duration>, Problem> {
    let bad = |why: String| Problem::bad_request(why).with_field("ttl");
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => sluice_core::parse_duration_or_error(&s)
            .map(Some)
            .map_err(|e| bad(format!("`ttl`: {e}"))),
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 1e9)
            .map(|s| Some(Duration::from_secs_f64(s)))
            .ok_or_else(|| {
                bad(format!(
                    "`ttl` is {n}; send seconds, or a duration such as \"5m\""
                ))
            }),
        Some(other) => Err(bad(format!(
            "`ttl` is {other}; send seconds, or a duration such as \"5m\""
        ))),
    }
}

/// A whole number that fits in 64 bits, as a JSON number or a decimal string (protobuf's JSON
/// form of 64-bit integers); `None` for anything else, a negative or a fraction included.
fn whole_number(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse().ok()
        }
        _ => None,
    }
}
