//! A thousand rule reloads under load, laid out as a Kubernetes ConfigMap mounts rules (a file
//! linked through `..data`, swapped atomically), mixing swaps, edits in place, files renamed
//! over the rules and invalid files: no request fails, an invalid file never replaces the rules
//! in force, and a limit that does not change keeps its count.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use sluice_core::MemoryStore;
use sluice_rules::ReloadEvent;
use sluice_server::{ServeOptions, Server};

/// The rules with the varying limit at `n` a minute; the stable limit never changes. The store
/// reads the real clock, and the reloads take seconds: the stable limit's window starts at its
/// first request, so that no window aligned to the clock ends between using it and reading it.
fn rules(n: u32) -> String {
    format!(
        "domain: shop
descriptors:
  - key: stable
    rate_limit: {{unit: hour, requests_per_unit: 5, alignment: first_request}}
  - key: vary
    rate_limit: {{unit: minute, requests_per_unit: {n}}}
"
    )
}

/// A ConfigMap swap: the new content in a fresh timestamped directory, `..data` relinked to it
/// atomically (a link made beside it, renamed over it).
fn swap(dir: &Path, version: usize, content: &str) {
    let data = format!("..2026_11_23_{version:06}");
    std::fs::create_dir(dir.join(&data)).unwrap();
    std::fs::write(dir.join(&data).join("rules.yaml"), content).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(&data, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

async fn check(client: &reqwest::Client, url: &str, key: &str, cost: u64) -> (u16, Value) {
    let body = json!({"domain": "shop", "descriptors": [{"entries": [{"key": key, "value": "u"}], "cost": cost}]});
    let r = client.post(url).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_reloads_under_load_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    swap(dir.path(), 0, &rules(10));
    // The mounted file is a link through ..data, as in a ConfigMap volume.
    symlink("..data/rules.yaml", dir.path().join("rules.yaml")).unwrap();
    let mut options = ServeOptions::new(vec![dir.path().join("rules.yaml")]);
    options.http_addr = "127.0.0.1:0".parse().unwrap();
    options.grpc_addr = "127.0.0.1:0".parse().unwrap();
    let server = Server::start_with_store(options, Arc::new(MemoryStore::new()))
        .await
        .unwrap();
    let url = format!("http://{}/v1/check", server.http_addr());
    let client = reqwest::Client::new();

    // Use 3 of the stable limit's 5 before the reloads.
    for _ in 0..3 {
        assert_eq!(check(&client, &url, "stable", 1).await.0, 200);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (client, url, stop) = (client.clone(), url.clone(), stop.clone());
        tokio::spawn(async move {
            let mut answered = 0;
            while !stop.load(Ordering::Relaxed) {
                let (status, body) = check(&client, &url, "vary", 1).await;
                assert!(status == 200 || status == 429, "{status}: {body}");
                answered += 1;
            }
            answered
        })
    };

    let reloader = server.limiter().reloader().clone();
    let path = dir.path().to_owned();
    let (reloaded, refused) = tokio::task::spawn_blocking(move || {
        let (mut reloaded, mut refused) = (0, 0);
        for i in 1..=1000 {
            let valid = i % 4 != 3;
            let content = if valid {
                rules(10 + (i % 7) as u32)
            } else {
                "domain: [\n".to_owned()
            };
            let before = reloader.rules().fingerprint();
            match i % 3 {
                // A ConfigMap update.
                0 => swap(&path, i, &content),
                // An edit in place, through the link.
                1 => std::fs::write(path.join("rules.yaml"), &content).unwrap(),
                // A file written beside the data and renamed over it.
                _ => {
                    let target = std::fs::canonicalize(path.join("rules.yaml")).unwrap();
                    let tmp = target.with_extension("tmp");
                    std::fs::write(&tmp, &content).unwrap();
                    std::fs::rename(&tmp, &target).unwrap();
                }
            }
            match reloader.reload_now() {
                ReloadEvent::Failed(e) => {
                    assert!(!valid, "a valid file refused: {e}");
                    assert!(e.to_string().contains("rules.yaml:"), "{e}");
                    assert_eq!(reloader.rules().fingerprint(), before, "the old rules stay");
                    refused += 1;
                }
                ReloadEvent::Reloaded { .. } | ReloadEvent::Unchanged => {
                    assert!(valid, "an invalid file was accepted at step {i}");
                    reloaded += 1;
                }
            }
        }
        (reloaded, refused)
    })
    .await
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    let answered = load.await.unwrap();
    assert_eq!((reloaded, refused), (750, 250));
    assert!(answered > 0);

    // The stable limit kept its count through every reload: 2 of 5 left.
    let (status, body) = check(&client, &url, "stable", 0).await;
    assert_eq!(status, 200);
    assert_eq!(
        body["descriptors"][0]["limits"][0]["remaining"], 2,
        "{body}"
    );
    server.shutdown().await;
}
