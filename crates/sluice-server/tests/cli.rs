//! The `sluice` binary's command line.

use std::process::Command;

fn sluice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

#[test]
fn validate_accepts_the_example_rules() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/rules.yaml");
    let out = sluice().args(["validate", example]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("example"));
}

#[test]
fn validate_names_the_location_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n").unwrap();
    let out = sluice().arg("validate").arg(&path).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rules.yaml:4:"), "{stderr}");
}

#[test]
fn serve_exits_non_zero_on_invalid_rules() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, "domain: [\n").unwrap();
    let out = sluice()
        .args([
            "serve",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("rules.yaml:"));
}

#[test]
fn every_option_reads_its_environment_variable() {
    let out = sluice()
        .arg("serve")
        .env("SLUICE_CONFIG", "/nonexistent/rules.yaml")
        .env("SLUICE_HTTP_ADDR", "127.0.0.1:0")
        .env("SLUICE_GRPC_ADDR", "127.0.0.1:0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/rules.yaml"), "{stderr}");
}
