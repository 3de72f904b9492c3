//! Logs written to a pipe or a file carry no terminal colour codes.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use sluice_testing::process::{Spawned, free_addr};

#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap();
    let (http, grpc) = (free_addr(), free_addr());
    let mut child = Spawned(
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args([
                "serve",
                "--http-addr",
                &http,
                "--grpc-addr",
                &grpc,
                "--config",
            ])
            .arg(&rules)
            .env_remove("NO_COLOR")
            .env("SLUICE_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    // The first line is the start-up log; wait for it, not for a time.
    let line = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("sluice is serving"))
        .expect("a start-up line");
    assert!(!line.contains('\u{1b}'), "colour codes in {line:?}");
    assert!(line.contains("INFO"), "{line}");
}
