//! Logs written to a pipe or a file carry no terminal colour codes.

use std::io::{BufRead, BufReader};

use sluice_test_support::{ServeProcess, rules_file};

#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    let (rules, _dir) = rules_file(
        "rules.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    let mut child = ServeProcess::builder(env!("CARGO_BIN_EXE_sluice"))
        .config(&rules)
        .env_remove("NO_COLOR")
        .env("SLUICE_LOG", "info")
        .piped_stdout()
        .spawn();
    let stdout = child.take_stdout().unwrap();
    // The first line is the start-up log; wait for it, not for a time.
    let line = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("sluice is serving"))
        .expect("a start-up line");
    assert!(!line.contains('\u{1b}'), "colour codes in {line:?}");
    assert!(line.contains("INFO"), "{line}");
}
