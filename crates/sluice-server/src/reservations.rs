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

use sluice_core::Decision;
use sluice_limiter::limits::MAX_BODY;
use sluice_limiter::{
    InvalidReservation, LimitRequest, LimitResult, Limiter, RequestDescriptor, SettleRefused,
};
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
            admitted_without_store: verdict.allowed && reserved.store_failed,
        }))
    }

    async fn settle(
        &self,
        request: Request<SettleRequest>,
    ) -> Result<Response<SettleResponse>, Status> {
        let SettleRequest { reservation, used } = request.into_inner();
        let settled = self
            .limiter
            .settle_named(&reservation, used)
            .await
            .map_err(|refused| {
                let message = refused.to_string();
                match refused {
                    SettleRefused::UsedTooLarge(_) => Status::invalid_argument(message),
                    SettleRefused::Unknown(_) => Status::not_found(message),
                    SettleRefused::AlreadySettled | SettleRefused::Expired => {
                        Status::failed_precondition(message)
                    }
                    SettleRefused::StoreFailed(_) => Status::unavailable(message),
                    SettleRefused::Unsupported(_) => Status::unimplemented(message),
                }
            })?;
        Ok(Response::new(SettleResponse {
            reserved: settled.reserved,
            used: settled.used,
            refunded: settled.refunded,
            charged: settled.charged,
        }))
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
