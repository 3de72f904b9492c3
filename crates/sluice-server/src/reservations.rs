//! `sluice.v1.Reservations`: `Reserve` and `Settle`, the gRPC form of `/v1/reserve` and
//! `/v1/settle` (see `docs/usage-limits.md`). Both go to the same [`Limiter::reserve`] and
//! [`Limiter::settle`] as the HTTP API, and fail with the gRPC status that means what the HTTP
//! status means, with the same message: the table is in `proto/sluice/v1/reservations.proto`.
//!
//! These calls go through tonic's generated server: unlike `ShouldRateLimit`, which the service
//! reads and answers itself, they are not on Envoy's per-request path, and a reservation costs a
//! store write and a record either way.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Decision, ReservationId, Settlement};
use sluice_limiter::limits::MAX_BODY;
use sluice_limiter::{InvalidReservation, LimitRequest, LimitResult, Limiter, RequestDescriptor};
use tonic::{Request, Response, Status};

use crate::sluice_v1::reservations_server::{Reservations, ReservationsServer};
use crate::sluice_v1::{
    Descriptor, DescriptorStatus, LimitStatus, ReserveRequest, ReserveResponse, SettleRequest,
    SettleResponse,
};

/// The gRPC reservations service.
#[derive(Debug, Clone)]
pub struct ReservationsService {
    limiter: Arc<Limiter>,
}

impl ReservationsService {
    /// A service reserving and settling with `limiter`.
    pub fn new(limiter: Arc<Limiter>) -> Self {
        ReservationsService { limiter }
    }

    /// The tonic server for this service, taking messages as large as `ShouldRateLimit`'s.
    pub fn into_server(self) -> ReservationsServer<Self> {
        ReservationsServer::new(self).max_decoding_message_size(MAX_BODY)
    }
}

#[tonic::async_trait]
impl Reservations for ReservationsService {
    async fn reserve(
        &self,
        request: Request<ReserveRequest>,
    ) -> Result<Response<ReserveResponse>, Status> {
        let ReserveRequest {
            domain,
            descriptors,
            amount,
            ttl,
        } = request.into_inner();
        let ttl = ttl.map(requested_ttl).transpose()?;
        let request = LimitRequest {
            domain,
            descriptors: descriptors.into_iter().map(descriptor).collect(),
            // Replaced by `amount` for every limit.
            cost: 1,
        };
        let reserved = self
            .limiter
            .reserve(&request, amount, ttl)
            .await
            .map_err(|e| match e {
                InvalidReservation::Unsupported(why) => Status::unimplemented(why),
                e => Status::invalid_argument(e.to_string()),
            })?;
        let verdict = &reserved.verdict;
        let statuses = (0..request.descriptors.len())
            .map(|i| DescriptorStatus {
                allowed: !verdict.status(i).refused,
                unlimited: verdict.unlimited.contains(&i),
                limits: verdict.for_descriptor(i).map(limit_status).collect(),
            })
            .collect();
        Ok(Response::new(ReserveResponse {
            allowed: verdict.allowed,
            reservation: reserved
                .reservation
                .map(|id| id.to_string())
                .unwrap_or_default(),
            statuses,
            ttl: Some(duration(reserved.ttl)),
            amount,
        }))
    }

    async fn settle(
        &self,
        request: Request<SettleRequest>,
    ) -> Result<Response<SettleResponse>, Status> {
        let SettleRequest { reservation, used } = request.into_inner();
        if used > u64::from(u32::MAX) {
            return Err(Status::invalid_argument(format!(
                "`used` is {used}; send the units used, a whole number from 0 to {}",
                u32::MAX
            )));
        }
        // A garbled id names no reservation, as an unknown one does.
        let Ok(id) = reservation.parse::<ReservationId>() else {
            return Err(unknown(&reservation));
        };
        let settled = self.limiter.settle(&id, used).await.map_err(|e| {
            if e.is_transient() {
                Status::unavailable(format!("the store failed; retry the settle: {e}"))
            } else {
                Status::unimplemented(e.to_string())
            }
        })?;
        match settled {
            Settlement::Settled {
                reserved,
                refunded,
                charged,
            } => Ok(Response::new(SettleResponse {
                reserved,
                used,
                refunded,
                charged,
            })),
            Settlement::AlreadySettled => Err(Status::failed_precondition(
                "this reservation was settled before; this settle refunded and charged nothing",
            )),
            Settlement::Expired => Err(Status::failed_precondition(
                "this reservation's ttl ran out before it was settled: it counted as used in \
                 full, and nothing was refunded",
            )),
            Settlement::Unknown => Err(unknown(&reservation)),
        }
    }
}

/// A descriptor of the request as the limiter takes it: entries only, since the reservation's
/// amount is every limit's cost.
fn descriptor(d: Descriptor) -> RequestDescriptor {
    RequestDescriptor {
        entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
        cost: None,
        limit_override: None,
        envoy_hits: false,
        refund: false,
    }
}

/// The ttl a request asked for, refused when negative; [`Limiter::reserve`] refuses 0 and one
/// above the maximum.
fn requested_ttl(ttl: prost_types::Duration) -> Result<Duration, Status> {
    let shown = format!("{}s {}ns", ttl.seconds, ttl.nanos);
    Duration::try_from(ttl).map_err(|_| {
        Status::invalid_argument(format!(
            "`ttl` is {shown}; send a positive duration, at most the maximum reservation ttl"
        ))
    })
}

/// One limit's answer.
fn limit_status(c: &LimitResult) -> LimitStatus {
    let d = &c.decision;
    LimitStatus {
        name: c.name().to_owned(),
        key: c.key.clone(),
        allowed: d.allowed,
        observed: !c.enforced(),
        limit: d.limit,
        remaining: d.remaining,
        reset_after: Some(duration(d.reset_after)),
        retry_after: (d.retry_after != Decision::NEVER).then(|| duration(d.retry_after)),
    }
}

/// `d` as protobuf's `Duration`, saturating at its largest (10,000 years: far beyond any limit).
fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).unwrap_or(prost_types::Duration {
        seconds: 315_576_000_000,
        nanos: 999_999_999,
    })
}

/// The answer to a settle of an id the store does not hold.
fn unknown(reservation: &str) -> Status {
    let shown: String = reservation.chars().take(64).collect();
    Status::not_found(format!(
        "no reservation `{shown}` on this store: it was never made here, or was forgotten twice \
         its ttl after it was made"
    ))
}
