//! `sluice simulate`: the seeds' worked examples through the binary, the report's files, and
//! located errors for a bad trace.

use std::process::{Command, Output};

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("sluice runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_boundary_burst_gets_ten_through_a_fixed_window_at_five_a_minute_and_the_log_holds() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("report");
    let out = sluice(&[
        "simulate",
        "--compare",
        "--pattern",
        "boundary",
        "--limit",
        "5",
        "--window",
        "1m",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    // | lane | admitted | refused | largest in any window | limit |
    assert!(
        table.contains("| fixed_window | 40 | 0 | 10 | 5 |"),
        "{table}"
    );
    assert!(
        table.contains("| sliding_log | 20 | 20 | 5 | 5 |"),
        "{table}"
    );

    let page = std::fs::read_to_string(out_dir.join("report.html")).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>") && page.trim_end().ends_with("</html>"));
    // One plot per algorithm, seven in all, each a complete SVG.
    assert_eq!(page.matches("<svg ").count(), 7);
    assert_eq!(page.matches("</svg>").count(), 7);
    for algorithm in [
        "token_bucket",
        "gcra",
        "leaky_queue",
        "fixed_window",
        "sliding_log",
        "sliding_counter",
        "bucketed_window",
    ] {
        assert!(
            page.contains(&format!("<strong>{algorithm}</strong>")),
            "{algorithm}"
        );
    }
    let csv = std::fs::read_to_string(out_dir.join("decisions.csv")).unwrap();
    // A header, then 40 requests decided by each of seven lanes.
    assert_eq!(csv.lines().count(), 1 + 7 * 40);
}

#[test]
fn a_rules_file_and_a_trace_file_are_simulated_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_log}\n",
    )
    .unwrap();
    let trace = dir.path().join("trace.csv");
    // Three requests within a minute from alice, then one a minute later.
    std::fs::write(&trace, "seconds,key\n0,alice\n1,alice\n2,alice\n61,alice\n").unwrap();
    let out_dir = dir.path().join("out");
    let out = sluice(&[
        "simulate",
        "--config",
        rules.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(table.contains("| api/user | 3 | 1 | 2 | 2 |"), "{table}");
    let csv = std::fs::read_to_string(out_dir.join("decisions.csv")).unwrap();
    let allowed: Vec<&str> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(4).unwrap())
        .collect();
    assert_eq!(allowed, ["true", "true", "false", "true"]);
}

#[test]
fn a_bad_trace_is_refused_with_its_location() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("bad.csv");
    std::fs::write(&trace, "0,a\n1,a,lots\n").unwrap();
    let out = sluice(&["simulate", "--trace", trace.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("bad.csv:2:5:"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn the_counter_error_table_is_printed_and_repeatable() {
    let args = [
        "simulate",
        "--counter-error",
        "--requests",
        "20000",
        "--keys",
        "200",
        "--duration",
        "10m",
    ];
    let first = sluice(&args);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let table = text(&first.stdout);
    assert!(
        table.contains("| compared | 20000 | 100.0000% |"),
        "{table}"
    );
    assert!(table.contains("| **disagree** |"), "{table}");
    assert!(
        table.contains("| keys offering over twice the limit |"),
        "{table}"
    );
    assert_eq!(
        sluice(&args).stdout,
        first.stdout,
        "the same seed gives the same table"
    );
}

#[test]
fn the_help_describes_every_pattern() {
    let out = sluice(&["simulate", "--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for line in [
        "- steady:   evenly spaced requests at --rate",
        "- boundary: the window-edge attack: the limit's worth in the last 1% of a window",
        "- diurnal:  random arrivals whose rate rises",
    ] {
        assert!(help.contains(line), "{line}\n{help}");
    }
    assert!(help.contains("no request arrives after it"), "{help}");
}

/// Boundary traffic needs more than two windows: a shorter run says so, rather than report
/// seven lanes that saw nothing.
#[test]
fn boundary_traffic_too_short_for_its_first_burst_is_refused_with_why() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("report");
    let out = sluice(&[
        "simulate",
        "--duration",
        "2m",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("boundary traffic over --duration 120s holds no request")
            && stderr.contains("Needs a --duration over two windows"),
        "{stderr}"
    );
}

/// The terminal's table and the report's have the same columns in the same order, and the
/// queue's limit of 6 at 5 a minute comes with its reason.
#[test]
fn the_terminal_and_the_report_show_the_same_table() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("report");
    let out = sluice(&[
        "simulate",
        "--pattern",
        "burst",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let columns = [
        "lane",
        "admitted",
        "refused",
        "largest in any 60s",
        "limit",
        "× limit",
        "policy",
        "longest queue wait",
    ];
    assert!(
        table.starts_with(&format!("| {} |\n", columns.join(" | "))),
        "{table}"
    );
    let page = std::fs::read_to_string(out_dir.join("report.html")).unwrap();
    let header: String = columns.iter().map(|c| format!("<th>{c}</th>")).collect();
    assert!(page.contains(&header), "{page}");
    assert!(
        table.contains("| 6 | 0.83× | 5 per minute, queue 5 (6 at once) |"),
        "{table}"
    );
}
