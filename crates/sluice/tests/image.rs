//! The container image's own binary, run as the image runs it. `scripts/image_test` builds the
//! image with `scripts/image`, exports its filesystem (`podman create` + `podman export`: on
//! these machines `podman run` cannot set resource limits) and runs these tests with
//! `SLUICE_IMAGE_ROOT` naming that directory; they are ignored otherwise, since they need the
//! image and root (for `chroot`).
//!
//! Each test starts the image's binary with `chroot --userspec` as the image's non-root user,
//! so it sees nothing but the image's files and the ones the test lays in it as Kubernetes
//! would mount them: Envoy Gateway's environment (`/bin/ratelimit`, rules under `RUNTIME_ROOT`,
//! gRPC over TLS with the certificates in `/certs`, Redis over TLS with its CA in
//! `/redis-certs`), and `/bin/sluice serve` as `deploy/kubernetes/` runs it (rules from a
//! ConfigMap laid out with `..data`, Redis).

use std::path::{Path, PathBuf};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice_redis::testing::RedisServer;
use sluice_test_support::window::LatestWindow;
use sluice_test_support::{ServeProcess, eventually_within, free_addr};

/// How long any one step may take: far beyond a healthy machine's need.
const STEP: Duration = Duration::from_secs(30);

/// The exported filesystem of the image.
fn image_root() -> PathBuf {
    let root = std::env::var_os("SLUICE_IMAGE_ROOT")
        .map(PathBuf::from)
        .expect("SLUICE_IMAGE_ROOT names the image's exported filesystem (scripts/image_test)");
    assert!(
        root.join("bin/sluice").is_file(),
        "no bin/sluice under {}",
        root.display()
    );
    root
}

/// The image's user, `uid:gid`, as its configuration names it.
fn image_user() -> String {
    std::env::var("SLUICE_IMAGE_USER").unwrap_or_else(|_| "65532:65532".to_owned())
}

/// Writes `text` at `path` inside `root` (an absolute path in the image), readable by all, as
/// a Kubernetes volume's files are.
fn lay(root: &Path, path: &str, text: &str) {
    let file = root.join(path.trim_start_matches('/'));
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, text).unwrap();
}

/// The user id the process `pid` runs as.
fn uid_of(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .unwrap()
        .to_owned()
}

fn port(addr: &str) -> &str {
    addr.rsplit_once(':').unwrap().1
}

fn request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "eg".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "generic_key".into(),
                value: "slow".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

/// The time until the window of the answer's one descriptor resets.
fn reset(r: &RateLimitResponse) -> Duration {
    let d = r.statuses[0]
        .duration_until_reset
        .expect("a reset for a limited descriptor");
    Duration::new(
        u64::try_from(d.seconds).unwrap(),
        u32::try_from(d.nanos).unwrap(),
    )
}

/// The status of `POST /v1/check` for `user=ann` in the domain `k8s`.
async fn check(http: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("http://{http}/v1/check"))
        .body(r#"{"domain":"k8s","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}"#)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn get(url: String) -> (u16, String) {
    let answer = reqwest::get(&url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = answer.status().as_u16();
    (status, answer.text().await.unwrap())
}

/// Envoy Gateway's rate-limit Deployment, with its rules in files: `/bin/ratelimit` as a
/// non-root user with Envoy Gateway's variables, gRPC over TLS with `/certs`, Redis over TLS
/// trusting the CA in `/redis-certs`, Prometheus metrics on their own address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the image's filesystem and root: run by scripts/image_test"]
async fn as_envoy_gateway_runs_it_ratelimit_over_tls_with_redis_over_tls() {
    let root = image_root();
    let redis = RedisServer::start_tls();
    let redis_tls = format!("127.0.0.1:{}", redis.tls_port.unwrap());
    lay(
        &root,
        "/redis-certs/ca.crt",
        &std::fs::read_to_string(redis.dir().join("ca.crt")).unwrap(),
    );
    let ca = sluice_testing::tls::Authority::new();
    let (cert, key) = ca.sign("localhost");
    let envoy = ca.sign("envoy");
    lay(&root, "/certs/ca.crt", &ca.pem);
    lay(&root, "/certs/tls.crt", &cert);
    lay(&root, "/certs/tls.key", &key);
    lay(
        &root,
        "/data/ratelimit/config/eg.yaml",
        "domain: eg
descriptors:
  - key: generic_key
    value: slow
    rate_limit: {unit: day, requests_per_unit: 2}
",
    );
    let (debug, prometheus) = (free_addr(), free_addr());
    let prefix = format!("image-{}", std::process::id());
    let vars = [
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_LEVEL", "info"),
        ("USE_STATSD", "false"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
        ("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", &redis_tls),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", "/redis-certs/ca.crt"),
        ("CACHE_KEY_PREFIX", &prefix),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", &prometheus),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", port(&debug)),
    ];
    let user = format!("--userspec={}", image_user());
    let root_arg = root.to_str().unwrap();
    let mut process = ServeProcess::ratelimit("/bin/ratelimit")
        .launched_by("chroot", [user.as_str(), root_arg])
        .envs(vars)
        .start();
    let (http, grpc) = (process.http().to_owned(), process.grpc().to_owned());
    assert_eq!(
        uid_of(process.pid()),
        image_user().split(':').next().unwrap(),
        "the image's binary runs as its non-root user"
    );

    assert_eq!(
        get(format!("http://{http}/healthcheck")).await,
        (200, "OK".to_owned())
    );

    // Envoy's client certificate, over TLS: two a day, the third refused.
    let channel = eventually_within("gRPC over TLS serves", STEP, || {
        sluice_testing::tls::channel(&grpc, &ca.pem, "localhost", Some(&envoy))
    })
    .await;
    let mut client = RateLimitServiceClient::new(channel);
    let mut day = LatestWindow::new();
    while day.len() < 3 {
        let answer = client.should_rate_limit(request()).await.unwrap();
        let answer = answer.into_inner();
        let until = reset(&answer);
        day.push(answer, until);
    }
    let codes: Vec<i32> = day.answers().iter().map(|a| a.overall_code).collect();
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32]
    );

    // The counters are in the Redis reached over TLS, under the prefix.
    let keys = redis.command(&["KEYS", &format!("{prefix}*")]).unwrap();
    assert!(
        keys.contains(&prefix),
        "no counter under {prefix}: {keys:?}"
    );

    let (status, metrics) = get(format!("http://{prometheus}/metrics")).await;
    assert_eq!(status, 200);
    let limited = metrics
        .lines()
        .find(|l| l.starts_with("sluice_decisions_total{") && l.contains(r#"outcome="limited""#))
        .unwrap_or_else(|| panic!("no refusal counted: {metrics}"));
    assert!(limited.contains(r#"domain="eg""#), "{limited}");
    assert!(limited.ends_with(" 1"), "{limited}");
    assert!(
        metrics.contains(r#"sluice_store_breaker_state{state="closed"} 1"#),
        "{metrics}"
    );
    let (status, rlconfig) = get(format!("http://{debug}/rlconfig")).await;
    assert_eq!(status, 200);
    assert!(rlconfig.contains("eg.generic_key_slow"), "{rlconfig}");

    assert!(process.terminate().success(), "stops cleanly on SIGTERM");
}

/// `sluice serve` as `deploy/kubernetes/` runs it: the image's own binary on a Redis, its rules
/// from a ConfigMap mount (a file linked through `..data`), answering the probes and a
/// decision, and following a swap of the ConfigMap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the image's filesystem and root: run by scripts/image_test"]
async fn as_kubernetes_runs_it_serve_with_configmap_rules_on_redis() {
    let root = image_root();
    let redis = sluice_redis::testing::shared_server();
    let rules = |limit: u32| {
        format!(
            "domain: k8s
descriptors:
  - key: user
    rate_limit: {{unit: day, requests_per_unit: {limit}}}
"
        )
    };
    // A ConfigMap volume: the data in a timestamped directory, `..data` linking to it, the
    // visible file linking through `..data`.
    let mount = root.join("etc/sluice/k8s-rules");
    let swap = |version: &str, limit: u32| {
        lay(
            &root,
            &format!("/etc/sluice/k8s-rules/{version}/rules.yaml"),
            &rules(limit),
        );
        let tmp = mount.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(version, &tmp).unwrap();
        std::fs::rename(&tmp, mount.join("..data")).unwrap();
    };
    swap("..2026_11_27_09_00_00.1", 0);
    std::os::unix::fs::symlink("..data/rules.yaml", mount.join("rules.yaml")).unwrap();

    let user = format!("--userspec={}", image_user());
    let root_arg = root.to_str().unwrap();
    let process = ServeProcess::builder("/bin/sluice")
        .launched_by("chroot", [user.as_str(), root_arg])
        .config("/etc/sluice/k8s-rules")
        .args([
            "--store",
            &redis.url(),
            "--store-prefix",
            &format!("image-k8s-{}", std::process::id()),
        ])
        .start();
    let http = process.http().to_owned();
    assert_eq!(get(format!("http://{http}/healthz")).await.0, 200);
    assert_eq!(
        get(format!("http://{http}/readyz")).await,
        (200, "ready".to_owned())
    );

    // A limit of 0 refuses; the ConfigMap's update to 1000 is followed.
    assert_eq!(check(&http).await, 429);
    swap("..2026_11_27_09_05_00.2", 1000);
    let http_ref = http.as_str();
    eventually_within("the swapped ConfigMap is in force", STEP, || async move {
        (check(http_ref).await == 200).then_some(())
    })
    .await;
    let (_, metrics) = get(format!("http://{http}/metrics")).await;
    assert!(metrics.contains("sluice_rule_reloads_total 1"), "{metrics}");
}
