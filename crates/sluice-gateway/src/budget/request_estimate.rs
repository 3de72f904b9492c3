//! The estimate a request reserves: read from its JSON body, bounded, and the body kept to be
//! forwarded as it came.

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Either, Full, Limited};
use sluice_http::RequestBody as ClientBody;
use sluice_rules::ReserveFrom;

use super::json_units::units_in;
use crate::forward::RequestBody;

/// Why the request cannot be forwarded: its body is too large to read, or could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unreadable {
    /// Larger than the route's `max_body`.
    TooLarge,
    /// The client stopped sending it, or sent it malformed.
    Broken,
}

impl Unreadable {
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Unreadable::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Unreadable::Broken => StatusCode::BAD_REQUEST,
        }
    }

    pub(crate) fn detail(self) -> &'static str {
        match self {
            Unreadable::TooLarge => {
                "the request body is larger than this route reads to find its reservation"
            }
            Unreadable::Broken => "the request body could not be read",
        }
    }
}

/// The units to reserve for a request, and the body to forward. A route without `from` does
/// not read the body: every request reserves `default`.
pub(crate) async fn estimate(
    reserve: &ReserveFrom,
    headers: &HeaderMap,
    body: ClientBody,
) -> Result<(u64, RequestBody), Unreadable> {
    let Some(path) = &reserve.from else {
        return Ok((reserve.default, Either::Left(body)));
    };
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > reserve.max_body) {
        return Err(Unreadable::TooLarge);
    }
    let limit = usize::try_from(reserve.max_body).unwrap_or(usize::MAX);
    let bytes: Bytes = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(Unreadable::TooLarge),
        Err(_) => return Err(Unreadable::Broken),
    };
    let units = units_in(&bytes, path).map_or(reserve.default, |n| clamp(n, reserve));
    Ok((units, Either::Right(Full::new(bytes))))
}

/// A request's own figure, within what a reservation may take: at least 1 (a request that
/// asks for nothing may still use something), at most `max`.
fn clamp(units: u64, reserve: &ReserveFrom) -> u64 {
    units.clamp(1, reserve.max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_is_kept_within_one_and_max() {
        let reserve = ReserveFrom {
            from: None,
            default: 10,
            max: 100,
            max_body: 1024,
        };
        assert_eq!(clamp(0, &reserve), 1);
        assert_eq!(clamp(50, &reserve), 50);
        assert_eq!(clamp(5000, &reserve), 100);
    }
}
