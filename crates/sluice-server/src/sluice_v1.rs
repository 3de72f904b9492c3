//! The messages, server and client of `sluice.v1`, generated at build time from
//! `proto/sluice/v1/reservations.proto` (see `build.rs`). Clients in Rust can use
//! [`reservations_client::ReservationsClient`]; others generate their own from the same file.

#![allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]

tonic::include_proto!("sluice.v1");
