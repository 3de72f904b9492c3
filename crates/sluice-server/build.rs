//! Generates the `sluice.v1.Reservations` messages, server and client from
//! `proto/sluice/v1/reservations.proto`. The file is compiled by `protox`, a protobuf compiler
//! in Rust, so building needs no `protoc` on the machine: CI has only the Rust toolchain.

use std::path::Path;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = root.join("sluice/v1/reservations.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let descriptors = match protox::compile([&file], [&root]) {
        Ok(descriptors) => descriptors,
        Err(e) => panic!("{} does not compile: {e:?}", file.display()),
    };
    if let Err(e) = tonic_prost_build::configure().compile_fds(descriptors) {
        panic!("cannot generate the code of {}: {e}", file.display());
    }
}
