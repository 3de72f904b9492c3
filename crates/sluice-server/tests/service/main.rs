//! The service end to end: a real server on loopback ports, a real gRPC client and a real HTTP
//! client. Counters live in a memory store on a fake clock, so no test depends on timing.
//!
//! One test binary, its tests by feature: Envoy's gRPC protocol (`grpc`), envoyproxy/ratelimit's
//! answers and settings over gRPC and `/json` (`envoy_compat`), Envoy's quota flows as its
//! repository runs them (`envoy_quota_flows`), the HTTP API (`http_api`), the admin endpoints
//! (`admin`), starting and stopping (`lifecycle`), and reservations over HTTP (`reservations`)
//! and over gRPC (`grpc_reservations`), runtime overrides through the admin API (`overrides`); the server they share and the calls they repeat are in
//! `harness`.

mod admin;
mod envoy_compat;
mod envoy_quota_flows;
mod grpc;
mod grpc_reservations;
mod harness;
mod hostile_connections;
mod http_api;
mod lifecycle;
mod overrides;
mod reservations;
