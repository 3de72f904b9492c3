//! The binary run the way Envoy Gateway and Istio run envoyproxy/ratelimit: started under the
//! name `ratelimit` (or as `sluice serve --envoy-env`) with only envoyproxy/ratelimit's
//! environment variables, it finds its rules under `RUNTIME_ROOT`, keeps its counters in the
//! Redis that `REDIS_URL` names, serves `/healthcheck`, `/rlconfig` on the debug port and the
//! metrics on the Prometheus address, adds the rate-limit headers and applies the global shadow
//! mode when asked, speaks mutual TLS on gRPC, and names what it does not honour.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice_test_support::window::LatestWindow;
use sluice_test_support::{Listener, ServeProcess, free_addr};
use tonic::transport::Channel;

/// Two a day, in envoyproxy/ratelimit's own format: its windows are aligned to the clock, so a
/// day can still end between two checks (at midnight UTC), and the checks are recorded in a
/// [`LatestWindow`] and held to what one day answers.
const RULES: &str = "domain: rl
descriptors:
  - key: generic_key
    value: slow
    rate_limit: {unit: day, requests_per_unit: 2}
";

/// envoyproxy/ratelimit's layout: `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/*.yaml`.
fn runtime_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("ratelimit").join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("config.yaml"), RULES).unwrap();
    root
}

/// The binary under the name `ratelimit`, as an image's `/bin/ratelimit`.
fn ratelimit_symlink(dir: &Path) -> PathBuf {
    let link = dir.join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), &link).unwrap();
    link
}

fn port(addr: &str) -> &str {
    addr.rsplit_once(':').unwrap().1
}

/// A command with only `vars` in its environment (and PATH), its output (logs and errors)
/// to `log`.
fn command(program: &Path, args: &[&str], vars: &[(&str, &str)], log: &Path) -> Command {
    let out = std::fs::File::create(log).unwrap();
    let mut c = Command::new(program);
    c.args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(vars.iter().copied())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    c
}

fn request(hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "rl".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "generic_key".into(),
                value: "slow".into(),
            }],
            ..Default::default()
        }],
        hits_addend: hits,
    }
}

async fn ask(client: &mut RateLimitServiceClient<Channel>) -> RateLimitResponse {
    client
        .should_rate_limit(request(1))
        .await
        .unwrap()
        .into_inner()
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

/// Asks until `day` holds `n` answers of one day.
async fn ask_until(
    client: &mut RateLimitServiceClient<Channel>,
    day: &mut LatestWindow<RateLimitResponse>,
    n: usize,
) {
    while day.len() < n {
        let r = ask(client).await;
        let until = reset(&r);
        day.push(r, until);
    }
}

fn headers(r: &RateLimitResponse) -> Vec<(String, String)> {
    r.response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_as_ratelimit_it_runs_on_envoys_variables_alone() {
    let redis = sluice_redis::testing::shared_server();
    let redis_addr = format!("127.0.0.1:{}", redis.port);
    let root = runtime_root();
    let bin = tempfile::tempdir().unwrap();
    let program = ratelimit_symlink(bin.path());
    let (debug, prometheus) = (free_addr(), free_addr());
    let prefix = format!("envoy-env-{}", std::process::id());
    let log = bin.path().join("output.log");
    let vars = [
        ("RUNTIME_ROOT", root.path().to_str().unwrap()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", port(&debug)),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", &prometheus),
        ("LOG_LEVEL", "info"),
        ("LOG_FORMAT", "text"),
        ("BACKEND_TYPE", "redis"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TYPE", "SINGLE"),
        ("REDIS_URL", &redis_addr),
        ("REDIS_POOL_SIZE", "10"),
        ("CACHE_KEY_PREFIX", &prefix),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("TRACING_ENABLED", "true"),
        // USE_STATSD is left at envoyproxy/ratelimit's default, true.
    ];
    let mut process = ServeProcess::ratelimit(&program)
        .envs(vars)
        .log_to(&log)
        .ready_on(Listener::Grpc)
        .start();
    let (http, grpc) = (process.http().to_owned(), process.grpc().to_owned());

    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let mut day = LatestWindow::new();
    ask_until(&mut client, &mut day, 3).await;
    let [first, second, third] = day.answers() else {
        unreachable!()
    };
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert_eq!(
        headers(first),
        [
            ("RateLimit-Limit".to_owned(), "2".to_owned()),
            ("RateLimit-Remaining".to_owned(), "1".to_owned()),
            (
                "RateLimit-Reset".to_owned(),
                first.statuses[0]
                    .duration_until_reset
                    .unwrap()
                    .seconds
                    .to_string()
            ),
        ]
    );
    assert_eq!(second.overall_code, Code::Ok as i32);
    assert_eq!(third.overall_code, Code::OverLimit as i32);
    assert_eq!(headers(third)[1].1, "0");

    // The counters are in the Redis that REDIS_URL names, under CACHE_KEY_PREFIX: one per day
    // the checks fell in (the day before a midnight in the test may have expired already).
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(
            &mut redis::Client::open(redis.url())
                .unwrap()
                .get_connection()
                .unwrap(),
        )
        .unwrap();
    assert!((1..=day.windows()).contains(&keys.len()), "{keys:?}");

    let web = reqwest::Client::new();
    let health = web
        .get(format!("http://{http}/healthcheck"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "OK");
    let rlconfig = web
        .get(format!("http://{debug}/rlconfig"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        rlconfig.contains("rl.generic_key_slow: unit=DAY requests_per_unit=2"),
        "{rlconfig}"
    );
    let metrics = web
        .get(format!("http://{prometheus}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 200);
    let metrics = metrics.text().await.unwrap();
    assert!(metrics.contains("limited"), "{metrics}");

    assert!(process.terminate().success());
    let stderr = std::fs::read_to_string(&log).unwrap();
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("not honoured"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    // statsd, envoyproxy/ratelimit's default, is honoured: sent to its default address.
    assert!(
        warnings[0].contains("TRACING_ENABLED") && !warnings[0].contains("USE_STATSD"),
        "{stderr}"
    );
    assert!(stderr.contains("REDIS_POOL_SIZE"), "{stderr}");
}

/// Envoy's `/json` on `http` for `generic_key=slow`, answered with a 200: how it came, its overall
/// code and its descriptor's, and the time until the descriptor's window resets.
async fn envoy_json(http: &str) -> ((&'static str, String, String), Duration) {
    let json = reqwest::Client::new()
        .post(format!("http://{http}/json"))
        .body(
            r#"{"domain":"rl","descriptors":[{"entries":[{"key":"generic_key","value":"slow"}]}]}"#,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(json.status(), 200);
    let body: serde_json::Value = json.json().await.unwrap();
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_else(|| panic!("{body}")).to_owned();
    let until = text(&body["statuses"][0]["durationUntilReset"]);
    let until = until
        .strip_suffix('s')
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{body}"));
    let said = (
        "/json",
        text(&body["overallCode"]),
        text(&body["statuses"][0]["code"]),
    );
    (said, Duration::from_secs_f64(until))
}

async fn tls_client(
    grpc: &str,
    ca_pem: &str,
    identity: Option<&(String, String)>,
) -> Result<RateLimitServiceClient<Channel>, tonic::transport::Error> {
    let channel = sluice_testing::tls::channel(grpc, ca_pem, "localhost", identity).await?;
    Ok(RateLimitServiceClient::new(channel))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_envoy_env_speaks_mutual_tls_and_the_global_shadow_mode() {
    let root = runtime_root();
    let dir = tempfile::tempdir().unwrap();
    let ca = sluice_testing::tls::Authority::new();
    let ca_pem = ca.pem.clone();
    let server = ca.sign("localhost");
    let client = ca.sign("envoy");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let (ca_file, cert_file, key_file) = (
        write("ca.pem", &ca_pem),
        write("server.pem", &server.0),
        write("server.key", &server.1),
    );
    let debug = free_addr();
    let log = dir.path().join("output.log");
    let vars = [
        ("RUNTIME_ROOT", root.path().to_str().unwrap()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", port(&debug)),
        ("USE_STATSD", "false"),
        ("SLUICE_STORE", "memory"),
        ("SHADOW_MODE", "true"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", &cert_file),
        ("GRPC_SERVER_TLS_KEY", &key_file),
        ("GRPC_CLIENT_TLS_CACERT", &ca_file),
    ];
    let mut process = ServeProcess::builder(env!("CARGO_BIN_EXE_sluice"))
        .arg("--envoy-env")
        .envoy_env()
        .envs(vars)
        .log_to(&log)
        .ready_on(Listener::Grpc)
        .start();
    let (http, grpc) = (process.http().to_owned(), process.grpc().to_owned());

    // A client without a certificate is refused in the handshake.
    let refused = match tls_client(&grpc, &ca_pem, None).await {
        Err(_) => true,
        Ok(mut c) => c.should_rate_limit(request(1)).await.is_err(),
    };
    assert!(refused, "a client without a certificate was answered");

    let mut client = tls_client(&grpc, &ca_pem, Some(&client)).await.unwrap();
    // Two of the day's two through gRPC, a third, then one through /json, in one day.
    let mut day = LatestWindow::new();
    while day.len() < 4 {
        if day.len() < 3 {
            let r = ask(&mut client).await;
            let code = |c: i32| Code::try_from(c).unwrap().as_str_name().to_owned();
            let said = ("gRPC", code(r.overall_code), code(r.statuses[0].code));
            day.push(said, reset(&r));
        } else {
            let (said, until) = envoy_json(&http).await;
            day.push(said, until);
        }
    }
    // Over the limit, the descriptor says so and the answer is OK (SHADOW_MODE); /json answers
    // the same, with a 200.
    let said: Vec<(&str, &str)> = day
        .answers()
        .iter()
        .map(|(_, overall, descriptor)| (overall.as_str(), descriptor.as_str()))
        .collect();
    assert_eq!(
        said,
        [
            ("OK", "OK"),
            ("OK", "OK"),
            ("OK", "OVER_LIMIT"),
            ("OK", "OVER_LIMIT")
        ],
        "{:?}",
        day.answers()
    );
    assert_eq!(day.answers()[3].0, "/json");

    assert!(process.terminate().success());
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(!stderr.contains("not honoured"), "{stderr}");
}

#[test]
fn what_cannot_work_stops_the_start_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("output.log");
    let program = ratelimit_symlink(dir.path());
    let cases = [
        (vec![("BACKEND_TYPE", "memcache")], "BACKEND_TYPE=memcache"),
        (vec![("CONFIG_TYPE", "XDS")], "CONFIG_TYPE=XDS"),
        (vec![], "REDIS_SOCKET_TYPE=tcp"),
        (
            vec![
                ("SLUICE_STORE", "memory"),
                ("RUNTIME_ROOT", "/nonexistent/sluice"),
            ],
            "/nonexistent/sluice/config",
        ),
    ];
    for (vars, expected) in cases {
        let status = command(&program, &[], &vars, &log).status().unwrap();
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert_eq!(status.code(), Some(1), "{vars:?}: {stderr}");
        assert!(stderr.contains(expected), "{vars:?}: {stderr}");
    }
    // --envoy-env is given alone.
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--envoy-env", "--config", "x.yaml"])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!status.status.success());
    assert!(String::from_utf8_lossy(&status.stderr).contains("give it alone"));
}
