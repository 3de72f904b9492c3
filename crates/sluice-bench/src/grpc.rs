//! gRPC targets: Envoy's `ShouldRateLimit`, the workers multiplexed over a few h2 connections.
//!
//! Each call is one length-prefixed protobuf message over hyper's h2 client, with the answer's
//! message and its `grpc-status` read back: the same wire as tonic's client, without its channel
//! (a buffer task and a load balancer per connection). The generator shares a 2-core machine
//! with the server it measures, and with tonic's client it used a whole core before Sluice's
//! gRPC service did.

use std::sync::{Arc, Mutex};

use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::net::TcpStream;

use super::{Answer, BenchError, Sender, Target, Template};

/// The path of `ShouldRateLimit`.
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// One descriptor: its entries, each value a template.
pub(crate) type DescriptorTemplate = Vec<(String, Template)>;

/// The rate-limit service to load.
#[derive(Debug)]
pub struct GrpcTarget {
    /// `host:port`, to connect to.
    authority: String,
    /// The call's URI.
    uri: Uri,
    domain: String,
    descriptors: Vec<DescriptorTemplate>,
    hits: u32,
    connections: usize,
    shared: Mutex<Vec<http2::SendRequest<Full<Bytes>>>>,
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
        let base: Uri = url
            .parse()
            .map_err(|e| invalid(format!("the address {addr:?} is invalid: {e}")))?;
        if base.scheme_str() != Some("http") {
            return Err(invalid(format!(
                "the address {addr:?} is invalid: the gRPC bench speaks h2 without TLS (http://)"
            )));
        }
        let authority = match base.authority() {
            Some(a) if a.port().is_some() => a.as_str().to_owned(),
            _ => {
                return Err(invalid(format!(
                    "the address {addr:?} is invalid: it needs a host and a port"
                )));
            }
        };
        let uri = format!("http://{authority}{PATH}")
            .parse()
            .map_err(|e| invalid(format!("the address {addr:?} is invalid: {e}")))?;
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
            authority,
            uri,
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

    /// Call number `key` as an h2 request: the message after its five-byte prefix.
    fn call(&self, key: u64) -> Result<http::Request<Full<Bytes>>, String> {
        let message = self.request(key);
        let len = message.encoded_len();
        let mut body = BytesMut::with_capacity(5 + len);
        body.put_u8(0);
        body.put_u32(u32::try_from(len).map_err(|_| "the request is too large".to_owned())?);
        message.encode_raw(&mut body);
        http::Request::post(self.uri.clone())
            .header(CONTENT_TYPE, "application/grpc")
            .header("te", "trailers")
            .body(Full::new(body.freeze()))
            .map_err(|e| format!("request: {e}"))
    }

    async fn open_h2(&self) -> Result<http2::SendRequest<Full<Bytes>>, String> {
        let stream = TcpStream::connect(self.authority.as_str())
            .await
            .map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let (send, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(send)
    }
}

/// `key=value,key=value` as entries; a key without `=value` is an error.
pub(crate) fn parse_descriptor(text: &str) -> Result<DescriptorTemplate, String> {
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
    send: http2::SendRequest<Full<Bytes>>,
}

impl Target for Arc<GrpcTarget> {
    type Sender = GrpcSender;

    async fn open(&self, index: usize) -> Result<GrpcSender, String> {
        let existing = {
            let shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            (shared.len() >= self.connections).then(|| shared[index % self.connections].clone())
        };
        let send = match existing {
            Some(send) => send,
            None => {
                let send = self.open_h2().await?;
                self.shared
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(send.clone());
                send
            }
        };
        Ok(GrpcSender {
            target: self.clone(),
            send,
        })
    }

    fn describe(&self) -> String {
        format!(
            "gRPC ShouldRateLimit at http://{} (domain {}, {} connection(s))",
            self.authority, self.domain, self.connections
        )
    }
}

/// A failed call's `grpc-status`, named as tonic names it: `None` when it is 0 (OK) or absent.
fn failed_status(headers: &HeaderMap) -> Option<String> {
    let status = headers.get("grpc-status")?;
    if status == HeaderValue::from_static("0") {
        return None;
    }
    let code = status
        .to_str()
        .ok()
        .and_then(|s| s.parse::<i32>().ok())
        .map_or_else(
            || format!("{status:?}"),
            |c| format!("{:?}", tonic::Code::from(c)),
        );
    Some(format!("gRPC {code}"))
}

impl Sender for GrpcSender {
    async fn send(&mut self, key: u64) -> Answer {
        let call = match self.target.call(key) {
            Ok(c) => c,
            Err(e) => return Answer::Error(e),
        };
        if self.send.ready().await.is_err() {
            return Answer::Error("connection closed".into());
        }
        let response = match self.send.send_request(call).await {
            Ok(r) => r,
            Err(e) => return Answer::Error(format!("connection: {e}")),
        };
        if response.status() != http::StatusCode::OK {
            return Answer::Error(format!("HTTP {}", response.status().as_u16()));
        }
        // A failure may come as headers alone (trailers only).
        if let Some(failed) = failed_status(response.headers()) {
            return Answer::Error(failed);
        }
        let body = match response.into_body().collect().await {
            Ok(b) => b,
            Err(e) => return Answer::Error(format!("connection: {e}")),
        };
        match body.trailers().map(failed_status) {
            Some(None) => {}
            Some(Some(failed)) => return Answer::Error(failed),
            None => return Answer::Error("no grpc-status".into()),
        }
        let bytes = body.to_bytes();
        let Some(message) = bytes.get(5..) else {
            return Answer::Error("no message".into());
        };
        match RateLimitResponse::decode(message).map(|r| Code::try_from(r.overall_code)) {
            Ok(Ok(Code::Ok)) => Answer::Allowed,
            Ok(Ok(Code::OverLimit)) => Answer::Limited,
            Ok(_) => Answer::Error("overall_code UNKNOWN".into()),
            Err(e) => Answer::Error(format!("the answer is not a RateLimitResponse: {e}")),
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
