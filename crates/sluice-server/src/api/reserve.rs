//! Sluice's `/v1/reserve` and `/v1/settle`: usage known only afterwards. A reservation takes
//! `amount` from every enforced limit of a `/v1/check` request at once, all or none; a settle
//! gives back what was not used, or charges what was used beyond it. See `docs/usage-limits.md`.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Map, Value};
use sluice_http::problem::Problem;
use sluice_limiter::{InvalidReservation, SettleRefused};

use super::check::{ReservationFields, json_answer, verdict_json};
use super::json_out::{key, string, uint};
use super::json_request::{Cursor, JsonRequest};
use super::{ApiBody, ApiState, body_text, collect_body, parse_json, status_of};

/// `POST /v1/reserve`.
pub(super) async fn reserve(state: &ApiState, body: impl ApiBody) -> Result<Response, Problem> {
    let bytes = collect_body(body).await?;
    let text = body_text(&bytes)?;
    let (json, amount, ttl) = match plain_reservation(text) {
        Some(plain) => plain,
        None => parse_reservation(text)?,
    };
    let amount = amount.ok_or_else(|| {
        Problem::bad_request("`amount` is missing; send the units to reserve").with_field("amount")
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
    let headers = reserved.verdict.headers(state.headers);
    let fields = ReservationFields {
        amount,
        reservation: reserved.reservation,
        ttl: reserved.ttl,
        without_store: reserved.verdict.allowed && reserved.store_failed,
    };
    let body = verdict_json(
        request.descriptors.len(),
        &reserved.verdict,
        &headers,
        Some(&fields),
    );
    Ok(json_answer(status_of(&reserved.verdict), body, headers))
}

/// A `/v1/reserve` body as clients send it: the request read by
/// [`JsonRequest::parse_plain_with`], `amount` as plain digits, and `ttl`, if there, as a
/// duration string or plain digits (seconds) that [`ttl`] would take. `None` for anything else,
/// which [`parse_reservation`] then reads, and refuses in its own words when it must.
fn plain_reservation(text: &str) -> Option<(JsonRequest, Option<u64>, Option<Duration>)> {
    let (mut amount, mut ttl) = (None, None);
    let json = JsonRequest::parse_plain_with(text, |c, field| match field {
        "amount" if amount.is_none() => {
            amount = Some(c.count()?);
            Some(())
        }
        "ttl" if ttl.is_none() => {
            let held = if c.peek()? == b'"' {
                sluice_core::parse_duration_or_error(c.string()?).ok()?
            } else {
                Duration::from_secs(c.count()?.min(MAX_TTL_SECS + 1))
            };
            // Past the bound `ttl` refuses: its refusal is worded there.
            if held > Duration::from_secs(MAX_TTL_SECS) {
                return None;
            }
            ttl = Some(held);
            Some(())
        }
        _ => None,
    })?;
    Some((json, amount, ttl))
}

/// The largest `ttl` in seconds a body may send as a number ([`ttl`]'s bound).
const MAX_TTL_SECS: u64 = 1_000_000_000;

/// Any `/v1/reserve` body: `amount` and `ttl` taken out, the rest read as a `/v1/check`
/// request, every fault named.
fn parse_reservation(text: &str) -> Result<(JsonRequest, Option<u64>, Option<Duration>), Problem> {
    let mut fields: Map<String, Value> = parse_json(text)?;
    let amount = amount(fields.remove("amount"))?;
    let ttl = ttl(fields.remove("ttl"))?;
    let json: JsonRequest =
        serde_path_to_error::deserialize(Value::Object(fields)).map_err(|e| {
            Problem::bad_request(format!("invalid JSON: {}", e.inner()))
                .with_field(e.path().to_string())
        })?;
    Ok((json, Some(amount), ttl))
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
    let (reservation, used) = match plain_settle(text) {
        Some((reservation, used)) => (reservation.to_owned(), used),
        None => {
            let SettleBody { reservation, used } = parse_json(text)?;
            // Anything but a whole number; one too large is refused below, in the limiter's
            // words.
            let used = whole_number(&used).ok_or_else(|| {
                Problem::bad_request(format!(
                    "`used` is {used}; send the units used, a whole number from 0 to {}",
                    u32::MAX
                ))
                .with_field("used")
            })?;
            (reservation, used)
        }
    };
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
    // In the order serde_json's map kept the keys (sorted), as the answer always read.
    let mut out = Vec::with_capacity(160 + reservation.len());
    out.push(b'{');
    for (name, n) in [("charged", settled.charged), ("refunded", settled.refunded)] {
        key(&mut out, name);
        uint(&mut out, n);
        out.push(b',');
    }
    key(&mut out, "reservation");
    string(&mut out, &reservation);
    out.push(b',');
    key(&mut out, "reserved");
    uint(&mut out, settled.reserved);
    out.extend_from_slice(b",\"settled\":true,");
    key(&mut out, "used");
    uint(&mut out, settled.used);
    out.push(b'}');
    Ok(json_answer(StatusCode::OK, out, Vec::new()))
}

/// A `/v1/settle` body as clients send it: `reservation` a string without escapes and `used`
/// plain digits, each once, nothing else. `None` for anything else, which serde then reads (and
/// refuses, naming the fault).
fn plain_settle(text: &str) -> Option<(&str, u64)> {
    let (mut reservation, mut used) = (None, None);
    let mut c = Cursor::new(text);
    c.object(|c, field| match field {
        "reservation" if reservation.is_none() => {
            reservation = Some(c.string()?);
            Some(())
        }
        "used" if used.is_none() => {
            used = Some(c.count()?);
            Some(())
        }
        _ => None,
    })?;
    c.end()?;
    Some((reservation?, used?))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`parse_reservation`] makes of a body, in a form to compare.
    fn slow(text: &str) -> Result<(JsonRequest, Option<u64>, Option<Duration>), String> {
        parse_reservation(text).map_err(|p| format!("{p:?}"))
    }

    /// Every body the plain reader takes, it reads as the general one does.
    #[test]
    fn plain_reservations_are_read_as_the_general_reader_reads_them() {
        let request = r#""domain":"llm","descriptors":[{"entries":[{"key":"user","value":"u7"}]}]"#;
        for extra in [
            r#""amount":500"#,
            r#""amount":0"#,
            r#""amount":18446744073709551615"#,
            r#""amount":5,"ttl":"5m""#,
            r#""ttl":"1500ms", "amount":5"#,
            r#""amount":5,"ttl":30"#,
            r#""amount":5,"ttl":0"#,
            r#""amount":5,"ttl":1000000000"#,
        ] {
            for text in [
                format!("{{{request},{extra}}}"),
                format!("{{{extra},{request}}}"),
            ] {
                let plain = plain_reservation(&text);
                assert!(plain.is_some(), "read plainly: {text}");
                assert_eq!(plain.ok_or_else(String::new), slow(&text), "{text}");
            }
        }
    }

    /// A settle in the shape clients send is read as serde reads it; anything else is left to
    /// serde.
    #[test]
    fn plain_settles_are_read_as_serde_reads_them() {
        for text in [
            r#"{"reservation":"rsv_0123456789abcdef0123456789abcdef","used":120}"#,
            r#"{ "used" : 0 , "reservation" : "garbled" }"#,
        ] {
            let (reservation, used) = plain_settle(text).expect("plain");
            let body: SettleBody = serde_json::from_str(text).unwrap();
            assert_eq!(
                (reservation, Some(used)),
                (&*body.reservation, body.used.as_u64())
            );
        }
        for text in [
            r#"{"reservation":"r","used":"5"}"#,
            r#"{"reservation":"r","used":5.0}"#,
            r#"{"reservation":"r","used":-1}"#,
            r#"{"reservation":"r\u0041","used":5}"#,
            r#"{"reservation":"r","used":5,"used":6}"#,
            r#"{"reservation":"r","used":5,"other":1}"#,
            r#"{"reservation":"r"}"#,
            r#"{"used":5}"#,
            r#"{"reservation":"r","used":5} x"#,
        ] {
            assert!(plain_settle(text).is_none(), "{text}");
        }
    }

    /// Anything else goes to the general reader, which names the fault.
    #[test]
    fn other_reservations_are_left_to_the_general_reader() {
        for text in [
            r#"{"domain":"d","descriptors":[],"amount":"5"}"#,
            r#"{"domain":"d","descriptors":[],"amount":5.0}"#,
            r#"{"domain":"d","descriptors":[],"amount":-1}"#,
            r#"{"domain":"d","descriptors":[],"amount":5,"amount":6}"#,
            r#"{"domain":"d","descriptors":[],"amount":5,"ttl":2.5}"#,
            r#"{"domain":"d","descriptors":[],"amount":5,"ttl":"soon"}"#,
            r#"{"domain":"d","descriptors":[],"amount":5,"ttl":1000000001}"#,
            r#"{"domain":"d","descriptors":[],"amount":5,"ttl":"100000000000s"}"#,
            r#"{"domain":"d","descriptors":[],"amount":5,"ttl":null}"#,
            r#"{"domain":"d","descriptors":[],"amount":5,"other":1}"#,
        ] {
            assert!(plain_reservation(text).is_none(), "{text}");
        }
        // A body without `amount` is read plainly, and refused as the general reader refuses it.
        let (_, amount, _) =
            plain_reservation(r#"{"domain":"d","descriptors":[]}"#).expect("plain");
        assert_eq!(amount, None);
        let e = slow(r#"{"domain":"d","descriptors":[]}"#).unwrap_err();
        assert!(e.contains("`amount` is missing"), "{e}");
    }
}
