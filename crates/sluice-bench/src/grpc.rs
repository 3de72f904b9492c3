//! gRPC targets: Envoy's `ShouldRateLimit`, the workers multiplexed over a few h2 connections.
//!
//! Each call is one length-prefixed protobuf message over the `h2` crate's client, with the
//! answer's message and its `grpc-status` read back: the same wire as tonic's client, without
//! its channel (a buffer task and a load balancer per connection) or hyper's (a dispatch task
//! and a body pipe per call). The call's HEADERS and DATA frames are queued together, so the
//! connection writes them in one system call; hyper's client wrote them in two. The generator
//! shares a 2-core machine with the server it measures, and at 512 connections it was the
//! generator's core that ran out first.

use std::future::poll_fn;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use h2::client::SendRequest;
use http::header::{CONTENT_TYPE, TE};
use http::{HeaderMap, HeaderValue, Uri};
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
    shared: Mutex<Vec<SendRequest<Bytes>>>,
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

    /// The head of every call: a POST to `ShouldRateLimit`, the fields `http`'s constants.
    fn head(&self) -> http::Request<()> {
        let mut request = http::Request::new(());
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = self.uri.clone();
        let headers = request.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(TE, HeaderValue::from_static("trailers"));
        request
    }

    /// The body of call number `key`: the message after its five-byte prefix. The message is
    /// written field by field, as prost writes it (a unit test holds them equal), without
    /// building the message's strings first.
    fn body(&self, key: u64) -> Result<Bytes, String> {
        let mut number = itoa::Buffer::new();
        // The prefix first (not compressed, then the length, filled in once it is known).
        let mut body = vec![0u8; 5];
        self.encode(number.format(key), &mut body);
        let len =
            u32::try_from(body.len() - 5).map_err(|_| "the request is too large".to_owned())?;
        body[1..5].copy_from_slice(&len.to_be_bytes());
        Ok(Bytes::from(body))
    }

    /// The `RateLimitRequest` of call `number` (its key, in decimal), encoded onto `out`.
    fn encode(&self, number: &str, out: &mut Vec<u8>) {
        use prost::encoding::{WireType, encode_key, encode_varint};
        let string_field = |out: &mut Vec<u8>, tag: u32, text: &[u8]| {
            encode_key(tag, WireType::LengthDelimited, out);
            encode_varint(text.len() as u64, out);
            out.extend_from_slice(text);
        };
        // The domain is never empty (`new` refuses it), so it is always written.
        string_field(out, 1, self.domain.as_bytes());
        let mut descriptor = Vec::with_capacity(32);
        let mut entry = Vec::with_capacity(32);
        let mut value = String::with_capacity(16);
        for entries in &self.descriptors {
            descriptor.clear();
            for (k, v) in entries {
                value.clear();
                v.render_into(number, &mut value);
                entry.clear();
                if !k.is_empty() {
                    string_field(&mut entry, 1, k.as_bytes());
                }
                if !value.is_empty() {
                    string_field(&mut entry, 2, value.as_bytes());
                }
                string_field(&mut descriptor, 1, &entry);
            }
            string_field(out, 2, &descriptor);
        }
        if self.hits != 0 {
            encode_key(3, WireType::Varint, out);
            encode_varint(u64::from(self.hits), out);
        }
    }

    async fn open_h2(&self) -> Result<SendRequest<Bytes>, String> {
        let stream = TcpStream::connect(self.authority.as_str())
            .await
            .map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let (send, connection) = h2::client::handshake(stream)
            .await
            .map_err(|e| e.to_string())?;
        // The connection ends with an error only when the server closes it, which the calls
        // on it report.
        tokio::spawn(async move {
            let _ = connection.await;
        });
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
    send: SendRequest<Bytes>,
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
        let body = match self.target.body(key) {
            Ok(b) => b,
            Err(e) => return Answer::Error(e),
        };
        if let Err(e) = poll_fn(|cx| self.send.poll_ready(cx)).await {
            return Answer::Error(format!("connection: {e}"));
        }
        let (response, mut stream) = match self.send.send_request(self.target.head(), false) {
            Ok(sent) => sent,
            Err(e) => return Answer::Error(format!("connection: {e}")),
        };
        if let Err(e) = stream.send_data(body, true) {
            return Answer::Error(format!("connection: {e}"));
        }
        let response = match response.await {
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
        let mut body = response.into_body();
        // The message comes in one DATA frame, unless the server split it.
        let mut whole: Option<Bytes> = None;
        while let Some(data) = body.data().await {
            let data = match data {
                Ok(d) => d,
                Err(e) => return Answer::Error(format!("connection: {e}")),
            };
            // Received bytes count against the windows until given back.
            let _ = body.flow_control().release_capacity(data.len());
            whole = Some(match whole.take() {
                None => data,
                Some(earlier) => Bytes::from([&earlier[..], &data[..]].concat()),
            });
        }
        match body.trailers().await {
            Ok(Some(trailers)) => {
                if let Some(failed) = failed_status(&trailers) {
                    return Answer::Error(failed);
                }
                if trailers.get("grpc-status").is_none() {
                    return Answer::Error("no grpc-status".into());
                }
            }
            Ok(None) => return Answer::Error("no grpc-status".into()),
            Err(e) => return Answer::Error(format!("connection: {e}")),
        }
        let bytes = whole.unwrap_or_default();
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
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
        RateLimitDescriptor, rate_limit_descriptor::Entry,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    use super::*;

    /// Call number `key`'s message as prost builds it: what [`GrpcTarget::encode`] must write.
    fn request(t: &GrpcTarget, key: u64) -> RateLimitRequest {
        RateLimitRequest {
            domain: t.domain.clone(),
            descriptors: t
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
            hits_addend: t.hits,
        }
    }

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
        let r = request(&t, 4);
        assert_eq!(r.hits_addend, 2);
        assert_eq!(r.descriptors[0].entries[0].value, "u4");
        assert_eq!(r.descriptors[0].entries[1].key, "path");
        assert_eq!(r.descriptors[1].entries[0].value, "all");
    }

    /// The message written field by field is byte for byte prost's encoding of the same request.
    #[test]
    fn calls_carry_prosts_encoding_of_the_request() {
        for (descriptors, hits) in [
            (
                vec!["user=u{n},path=/a".to_owned(), "global=all".to_owned()],
                2,
            ),
            (vec!["k={n}".to_owned()], 0),
            (vec!["empty=,x=y{n}z{n}".to_owned()], 300),
        ] {
            let t =
                GrpcTarget::new("127.0.0.1:8081", "shop".into(), &descriptors, hits, 1).unwrap();
            for key in [0, 7, 12_345, u64::MAX] {
                let head = t.head();
                assert_eq!(head.headers()[CONTENT_TYPE], "application/grpc");
                assert_eq!(head.headers()[TE], "trailers");
                assert_eq!(head.method(), http::Method::POST);
                let bytes = t.body(key).unwrap();
                let expected = request(&t, key).encode_to_vec();
                assert_eq!(bytes[0], 0);
                assert_eq!(&bytes[1..5], &(expected.len() as u32).to_be_bytes());
                assert_eq!(&bytes[5..], &expected[..], "{descriptors:?} {key}");
            }
        }
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
