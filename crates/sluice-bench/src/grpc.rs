//! gRPC targets: Envoy's `ShouldRateLimit`, the workers multiplexed over a few h2 connections.

use std::sync::{Arc, Mutex};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::{Channel, Endpoint};

use super::{Answer, BenchError, Sender, Target, Template};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

/// One descriptor: its entries, each value a template.
type DescriptorTemplate = Vec<(String, Template)>;

/// The rate-limit service to load.
#[derive(Debug)]
pub struct GrpcTarget {
    endpoint: Endpoint,
    domain: String,
    descriptors: Vec<DescriptorTemplate>,
    hits: u32,
    connections: usize,
    shared: Mutex<Vec<Channel>>,
}

impl GrpcTarget {
    /// A target at `addr` (`host:port` or `http://host:port`) asking about `domain` with
    /// `descriptors`, each written `key=value,key=value` (values may hold `{n}`), `hits` units
    /// each, over `connections` h2 connections.
    pub fn new(
        addr: &str,
        domain: String,
        descriptors: &[String],
        hits: u32,
        connections: usize,
    ) -> Result<Self, BenchError> {
        let invalid = |m: String| BenchError::Invalid(m);
        let url = if addr.contains("://") {
            addr.to_owned()
        } else {
            format!("http://{addr}")
        };
        let endpoint = Endpoint::from_shared(url)
            .map_err(|e| invalid(format!("the address {addr:?} is invalid: {e}")))?
            .tcp_nodelay(true);
        if domain.is_empty() {
            return Err(invalid("the domain must not be empty".into()));
        }
        if descriptors.is_empty() {
            return Err(invalid("give at least one --descriptor key=value".into()));
        }
        if connections == 0 {
            return Err(invalid("gRPC needs at least one connection".into()));
        }
        let descriptors = descriptors
            .iter()
            .map(|d| parse_descriptor(d).map_err(invalid))
            .collect::<Result<_, _>>()?;
        Ok(GrpcTarget {
            endpoint,
            domain,
            descriptors,
            hits,
            connections,
            shared: Mutex::new(Vec::new()),
        })
    }

    fn request(&self, key: u64) -> RateLimitRequest {
        RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: self
                .descriptors
                .iter()
                .map(|entries| RateLimitDescriptor {
                    entries: entries
                        .iter()
                        .map(|(k, v)| Entry {
                            key: k.clone(),
                            value: v.render(key),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: self.hits,
        }
    }
}

/// `key=value,key=value` as entries; a key without `=value` is an error.
fn parse_descriptor(text: &str) -> Result<DescriptorTemplate, String> {
    text.split(',')
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), Template::new(v))),
            _ => Err(format!(
                "the descriptor {text:?} must be key=value pairs separated by commas"
            )),
        })
        .collect()
}

/// A worker's side of a gRPC target.
pub(crate) struct GrpcSender {
    target: Arc<GrpcTarget>,
    client: RateLimitServiceClient<Channel>,
}

impl Target for Arc<GrpcTarget> {
    type Sender = GrpcSender;

    async fn open(&self, index: usize) -> Result<GrpcSender, String> {
        let existing = {
            let shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            (shared.len() >= self.connections).then(|| shared[index % self.connections].clone())
        };
        let channel = match existing {
            Some(c) => c,
            None => {
                let c = self.endpoint.connect().await.map_err(|e| {
                    // tonic's transport error says little; its source says what failed.
                    std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string())
                })?;
                self.shared
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(c.clone());
                c
            }
        };
        Ok(GrpcSender {
            target: self.clone(),
            client: RateLimitServiceClient::new(channel),
        })
    }

    fn describe(&self) -> String {
        format!(
            "gRPC ShouldRateLimit at {} (domain {}, {} connection(s))",
            self.endpoint.uri(),
            self.domain,
            self.connections
        )
    }
}

impl Sender for GrpcSender {
    async fn send(&mut self, key: u64) -> Answer {
        match self
            .client
            .should_rate_limit(self.target.request(key))
            .await
        {
            Ok(response) => match Code::try_from(response.into_inner().overall_code) {
                Ok(Code::Ok) => Answer::Allowed,
                Ok(Code::OverLimit) => Answer::Limited,
                _ => Answer::Error("overall_code UNKNOWN".into()),
            },
            Err(status) => Answer::Error(format!("gRPC {:?}", status.code())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_parse_and_render() {
        let t = GrpcTarget::new(
            "127.0.0.1:8081",
            "shop".into(),
            &["user=u{n},path=/a".into(), "global=all".into()],
            2,
            1,
        )
        .unwrap();
        let r = t.request(4);
        assert_eq!(r.hits_addend, 2);
        assert_eq!(r.descriptors[0].entries[0].value, "u4");
        assert_eq!(r.descriptors[0].entries[1].key, "path");
        assert_eq!(r.descriptors[1].entries[0].value, "all");
    }

    #[test]
    fn bad_options_are_refused_with_a_reason() {
        for (addr, domain, desc, why) in [
            ("127.0.0.1:1", "", "a=b", "domain"),
            ("127.0.0.1:1", "d", "=b", "key=value"),
            ("127.0.0.1:1", "d", "novalue", "key=value"),
            ("http://[::1", "d", "a=b", "invalid"),
        ] {
            let e = GrpcTarget::new(addr, domain.into(), &[desc.into()], 0, 1)
                .expect_err(addr)
                .to_string();
            assert!(e.contains(why), "{addr} {domain} {desc}: {e}");
        }
    }
}
