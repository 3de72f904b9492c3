//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use sluice_limiter::limits::MAX_BODY;
use sluice_limiter::{HeaderStyle, Limiter};
use tonic::{Request, Response, Status};

use crate::compat::EnvoyAnswers;
use crate::envoy::{RateLimitRequest, RateLimitResponse, to_limit_request, to_response};
use crate::envoy_stats::EnvoyStats;
use crate::metadata::dynamic_metadata;

/// The gRPC rate-limit service.
#[derive(Debug, Clone)]
pub struct RlsService {
    limiter: Arc<Limiter>,
    /// Which rate-limit headers to ask Envoy to add to the client's response.
    headers: HeaderStyle,
    /// The service-wide settings envoyproxy/ratelimit applies to every answer.
    answers: EnvoyAnswers,
    /// envoyproxy/ratelimit's statistics, when kept: every call and every limit it meets.
    stats: Option<Arc<EnvoyStats>>,
}

impl RlsService {
    /// A service deciding with `limiter`, adding `headers` to responses.
    pub fn new(limiter: Arc<Limiter>, headers: HeaderStyle) -> Self {
        RlsService {
            limiter,
            headers,
            answers: EnvoyAnswers::default(),
            stats: None,
        }
    }

    /// The same service, counting envoyproxy/ratelimit's statistics in `stats`.
    pub fn with_stats(mut self, stats: Option<Arc<EnvoyStats>>) -> Self {
        self.stats = stats;
        self
    }

    /// The same service, finishing every answer with `answers`.
    pub fn with_answers(mut self, answers: EnvoyAnswers) -> Self {
        self.answers = answers;
        self
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self).max_decoding_message_size(MAX_BODY)
    }
}

impl RlsService {
    /// The answer to one `ShouldRateLimit` call, or the status it fails with, counted in the
    /// statistics when they are kept: its time from the decoded message to the answer, as
    /// Envoy times the handler, and an invalid request as a `service_error`.
    pub(crate) async fn answer(
        &self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        let Some(stats) = &self.stats else {
            return self.decide(request).await;
        };
        let started = Instant::now();
        let answer = self.decide(request).await;
        stats.count_call(started.elapsed());
        if answer.is_err() {
            stats.count_service_error();
        }
        answer
    }

    async fn decide(&self, request: RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let sent_cost = request.hits_addend;
        let request = to_limit_request(request).map_err(Status::invalid_argument)?;
        let verdict = self
            .limiter
            .decide(&request)
            .await
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let mut response = to_response(&verdict, request.descriptors.len());
        if self.headers != HeaderStyle::None {
            response.response_headers_to_add = verdict
                .headers(self.headers)
                .into_iter()
                .map(|(k, v)| HeaderValue {
                    key: k.as_str().to_owned(),
                    value: v.to_str().unwrap_or_default().to_owned(),
                    ..Default::default()
                })
                .collect();
        }
        let shadowed = self.answers.finish(&mut response);
        if let Some(stats) = &self.stats {
            stats.count_verdict(&request, &verdict);
            if shadowed {
                stats.count_global_shadow();
            }
        }
        if self.answers.dynamic_metadata {
            response.dynamic_metadata = Some(dynamic_metadata(sent_cost, &request, &verdict));
        }
        Ok(response)
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.answer(request.into_inner()).await.map(Response::new)
    }
}
