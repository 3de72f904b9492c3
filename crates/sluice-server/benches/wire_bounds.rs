//! What refusing a `ShouldRateLimit` message with too many descriptors costs: decoded whole and
//! then validated (as it was), against counted on the wire and refused at the 65th
//! (`wire_bounds::check`), for the worst such message (64 KiB of empty descriptors, 32,763 of
//! them), with a normal request's decode and check beside them for scale.
//!
//! `cargo bench -p sluice-server --bench wire_bounds`; `docs/limits.md` records the results.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message;
use sluice_limiter::limits::MAX_BODY;
use sluice_server::envoy::to_limit_request;
use sluice_server::wire_bounds;

/// The largest message of empty descriptors the listener reads: a domain, then field 2 with
/// length 0 until the body limit.
fn empty_descriptors() -> Vec<u8> {
    let mut message = RateLimitRequest {
        domain: "shop".into(),
        ..Default::default()
    }
    .encode_to_vec();
    while message.len() + 2 <= MAX_BODY - 5 {
        message.extend_from_slice(&[0x12, 0x00]);
    }
    message
}

/// What Envoy sends for one route: one descriptor of two entries.
fn normal() -> Vec<u8> {
    let entry = |key: &str, value: &str| Entry {
        key: key.into(),
        value: value.into(),
    };
    RateLimitRequest {
        domain: "shop".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![entry("client", "10.1.2.3"), entry("path", "/checkout")],
            ..Default::default()
        }],
        hits_addend: 1,
    }
    .encode_to_vec()
}

/// Decoded, turned into a `LimitRequest` and validated: how the message was refused before.
fn decode_and_validate(message: &[u8]) -> bool {
    let Ok(request) = RateLimitRequest::decode(message) else {
        return false;
    };
    to_limit_request(request).is_ok_and(|r| r.validate().is_ok())
}

fn bench(c: &mut Criterion) {
    let hostile = empty_descriptors();
    let normal = normal();
    assert!(!decode_and_validate(&hostile) && wire_bounds::check(&hostile).is_err());
    assert!(decode_and_validate(&normal) && wire_bounds::check(&normal).is_ok());
    let mut group = c.benchmark_group("wire_bounds");
    group.bench_function("empty_descriptors/decode_and_validate", |b| {
        b.iter(|| decode_and_validate(black_box(&hostile)));
    });
    group.bench_function("empty_descriptors/check", |b| {
        b.iter(|| wire_bounds::check(black_box(&hostile)).is_ok());
    });
    group.bench_function("normal/decode_and_validate", |b| {
        b.iter(|| decode_and_validate(black_box(&normal)));
    });
    group.bench_function("normal/check", |b| {
        b.iter(|| wire_bounds::check(black_box(&normal)).is_ok());
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
