//! Every seed and every saved crash input, through its fuzz target: what a fuzzer once found
//! stays fixed, and the seeds exercise each target's happy path in every test run.

use std::path::{Path, PathBuf};

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    out.sort();
    out
}

#[test]
fn every_seed_and_saved_crash_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let examples = root.join("../../examples");
    for target in sluice_fuzz::TARGETS {
        let seeds = files(&root.join("corpus").join(target));
        assert!(!seeds.is_empty(), "{target} has no seed corpus");
        let mut inputs = seeds;
        inputs.extend(files(&root.join("regressions").join(target)));
        if target == "rules_yaml" {
            inputs.extend(files(&examples));
        }
        for path in inputs {
            let data = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| sluice_fuzz::run(target, &data));
            assert!(outcome.is_ok(), "{target} panics on {}", path.display());
        }
    }
}

#[test]
fn the_seeds_reach_past_the_parsers() {
    // Seeds that only exercise refusals would leave the fuzzer far from the interesting code:
    // the well-formed seeds must decode.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let reply = std::fs::read(root.join("redis_reply/two.bin")).unwrap();
    assert_eq!(
        sluice_redis::fuzzing::check_reply(&reply[1..], &[10, 20]),
        Some(2)
    );
    let reply = std::fs::read(root.join("redis_reply/one.bin")).unwrap();
    assert_eq!(
        sluice_redis::fuzzing::check_reply(&reply[1..], &[10]),
        Some(1)
    );
    for (seed, descriptors) in [("one.pb", 1), ("two.pb", 2)] {
        let bytes = std::fs::read(root.join("envoy_proto").join(seed)).unwrap();
        let message =
            <sluice_server::envoy::RateLimitRequest as prost::Message>::decode(&bytes[..])
                .unwrap_or_else(|e| panic!("{seed}: {e}"));
        assert_eq!(message.domain, "example");
        let request = sluice_server::envoy::to_limit_request(message).unwrap();
        assert_eq!(request.descriptors.len(), descriptors, "{seed}");
    }
    for seed in ["nested.yaml", "limits.yaml"] {
        let text = std::fs::read_to_string(root.join("rules_yaml").join(seed)).unwrap();
        if let Err(e) = sluice_rules::RuleSet::parse(seed, &text) {
            panic!("{seed}: {e}");
        }
    }
}
