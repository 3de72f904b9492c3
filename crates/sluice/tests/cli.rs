//! The `sluice` binary's command line.

use std::process::Command;

use sluice_test_support::{ServeProcess, Spawned, free_port};

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
fn validate_merges_the_files_of_one_domain_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    for (file, key) in [("a.yaml", "one"), ("b.yaml", "two")] {
        let text = format!(
            "domain: d\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        );
        std::fs::write(dir.path().join(file), text).unwrap();
    }
    let out = sluice().arg("validate").arg(dir.path()).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("b.yaml:1:9: domain `d` is already defined"),
        "{stderr}"
    );
    let out = sluice()
        .args(["validate", "--merge-domains"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok: 1 domain(s): d"
    );
}

/// A rule file whose only route uses `apikey` where the rules have `api_key`: it loads, and
/// the route is never limited.
fn gateway_with_a_misspelt_key(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("gateway.yaml");
    std::fs::write(
        &path,
        "domain: api\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: second, requests_per_unit: 1}\n\
         routes:\n  - name: keyed\n    descriptors:\n      - [{key: apikey, from: \"header:x-api-key\"}]\n",
    )
    .unwrap();
    path
}

#[test]
fn validate_warns_of_a_route_key_no_rule_has_and_passes() {
    let dir = tempfile::tempdir().unwrap();
    let path = gateway_with_a_misspelt_key(dir.path());
    let out = sluice().arg("validate").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("gateway.yaml:6:5: route `keyed` uses descriptor key `apikey`"),
        "{stderr}"
    );
    assert!(stderr.contains("did you mean `api_key`?"), "{stderr}");
}

#[test]
fn serve_logs_a_route_key_no_rule_has_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = gateway_with_a_misspelt_key(dir.path());
    let process = ServeProcess::builder(env!("CARGO_BIN_EXE_sluice"))
        .config(path.to_str().unwrap())
        .env("NO_COLOR", "1")
        .log_to(dir.path().join("log"))
        .start();
    drop(process);
    let text = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert!(
        text.contains("WARN") && text.contains("gateway.yaml:6:5: route `keyed`"),
        "{text}"
    );
    assert!(text.contains("did you mean `api_key`?"), "{text}");
}

/// `sluice serve` on ports the system picks.
fn serve_on_any_ports() -> Command {
    let mut serve = sluice();
    serve.args([
        "serve",
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
    ]);
    serve
}

#[test]
fn serve_refuses_a_bad_thread_count_with_a_reason() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/rules.yaml");
    let out = serve_on_any_ports()
        .args(["--config", example])
        .env("TOKIO_WORKER_THREADS", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("TOKIO_WORKER_THREADS must be a whole number above 0"),
        "{stderr}"
    );
}

#[test]
fn serve_exits_non_zero_on_invalid_rules() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, "domain: [\n").unwrap();
    let out = serve_on_any_ports()
        .arg("--config")
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

/// The status code and body of `METHOD path` sent over a fresh connection.
fn send(port: u16, method: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the process listens");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The status line's code of a `GET path` sent over a fresh connection.
fn get_status(port: u16, path: &str) -> u16 {
    send(port, "GET", path).0
}

/// The value of the series `name` (with its labels, as exposed) in a metrics exposition.
fn series(metrics: &str, name: &str) -> Option<u64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

/// `examples/gateway.yaml` written to `path`, its 5 a minute per IP made 5 an hour from each
/// address's first request. The proxy reads the real clock, and a minute aligned to it could end
/// among a test's six requests and let the sixth through; the rest of the example is kept.
fn example_gateway_without_clock_windows(path: &std::path::Path) {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/gateway.yaml");
    let text = std::fs::read_to_string(example).unwrap();
    let minute = "      unit: minute\n      requests_per_unit: 5\n";
    assert_eq!(
        text.matches(minute).count(),
        1,
        "the example changed:\n{text}"
    );
    let hour = "      unit: hour\n      requests_per_unit: 5\n      alignment: first_request\n";
    std::fs::write(path, text.replace(minute, hour)).unwrap();
}

/// How many threads of process `pid` are workers of tokio's multi-threaded runtime (named
/// `tokio-rt-worker`).
fn runtime_workers(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end() == "tokio-rt-worker")
        .count()
}

#[test]
fn proxy_limits_before_forwarding_and_reports_a_down_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("gateway.yaml");
    example_gateway_without_clock_windows(&rules);
    let (listen, upstream) = (free_port(), free_port());
    let mut child = Spawned::spawn(
        sluice()
            .args(["proxy", "--config"])
            .arg(&rules)
            .args(["--listen", &format!("127.0.0.1:{listen}")])
            .args(["--upstream", &format!("http://127.0.0.1:{upstream}")])
            .env("SLUICE_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null()),
    );
    // The process logs that it is forwarding once it listens: wait for that line, not a time.
    let logs = std::io::BufReader::new(child.0.stdout.take().unwrap());
    let ready = std::io::BufRead::lines(logs)
        .map_while(Result::ok)
        .any(|line| line.contains("is forwarding"));
    assert!(ready, "the proxy never said it was forwarding");
    // One worker per CPU the process may run on.
    let cpus = std::thread::available_parallelism().unwrap().get();
    let workers = runtime_workers(child.0.id());
    // Nothing listens upstream: the first five /api requests are forwarded and fail with 502,
    // the sixth is refused by the limit without reaching it, and other paths are not limited.
    let statuses: Vec<u16> = (0..6).map(|_| get_status(listen, "/api/x")).collect();
    let free = get_status(listen, "/elsewhere");
    drop(child);
    assert_eq!(statuses, [502, 502, 502, 502, 502, 429]);
    assert_eq!(free, 502);
    assert_eq!(workers, if cpus == 1 { 0 } else { cpus });
}

#[test]
fn proxy_admin_listener_serves_metrics_that_move_and_counts_a_failed_reload() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("gateway.yaml");
    example_gateway_without_clock_windows(&rules);
    let (listen, admin, upstream) = (free_port(), free_port(), free_port());
    let mut child = Spawned::spawn(
        sluice()
            .args(["proxy", "--config"])
            .arg(&rules)
            .args(["--listen", &format!("127.0.0.1:{listen}")])
            .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
            .args(["--upstream", &format!("http://127.0.0.1:{upstream}")])
            // Only the admin endpoint reloads during the test, so exactly one reload fails.
            .args(["--reload-debounce", "1h"])
            // A single-threaded runtime, as on one CPU: reloads run beside it all the same.
            .env("TOKIO_WORKER_THREADS", "1")
            .env("SLUICE_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null()),
    );
    // Log lines, as they come, from a thread: the test waits for lines, never for a time.
    let (lines, logged) = std::sync::mpsc::channel::<String>();
    let stdout = child.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let wait_for = |text: &str| {
        let bound = std::time::Duration::from_secs(30);
        while let Ok(line) = logged.recv_timeout(bound) {
            if line.contains(text) {
                return true;
            }
        }
        false
    };
    assert!(
        wait_for("is forwarding"),
        "the proxy never said it was forwarding"
    );
    // No worker threads: the service runs on the thread that started it.
    let workers = runtime_workers(child.0.id());

    let allowed = r#"sluice_decisions_total{domain="gateway",rule="api_per_ip",outcome="allowed"}"#;
    let limited = r#"sluice_decisions_total{domain="gateway",rule="api_per_ip",outcome="limited"}"#;
    let statuses: Vec<u16> = (0..6).map(|_| get_status(listen, "/api/x")).collect();
    let (status, metrics) = send(admin, "GET", "/metrics");
    let health = send(admin, "GET", "/healthz");
    std::fs::write(&rules, "domain: gateway\ndescriptors:\n  - key: client_ip\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n").unwrap();
    let (reload, reason) = send(admin, "POST", "/v1/reload");
    let failure_logged = wait_for("rules not reloaded");
    // The old rules stay in force.
    let still_limited = get_status(listen, "/api/x");
    let (_, after) = send(admin, "GET", "/metrics");
    drop(child);

    assert_eq!(workers, 0);
    assert_eq!(statuses, [502, 502, 502, 502, 502, 429]);
    assert_eq!(status, 200);
    assert_eq!(series(&metrics, allowed), Some(5), "{metrics}");
    assert_eq!(series(&metrics, limited), Some(1), "{metrics}");
    assert_eq!(
        series(&metrics, "sluice_rule_reload_failures_total"),
        Some(0)
    );
    assert_eq!(health, (200, "ok".to_owned()));
    assert_eq!(reload, 422, "{reason}");
    assert!(reason.contains("gateway.yaml:4:"), "{reason}");
    assert!(failure_logged, "the failed reload was not logged");
    assert_eq!(
        series(&after, "sluice_rule_reload_failures_total"),
        Some(1),
        "{after}"
    );
    assert_eq!(series(&after, limited), Some(2), "{after}");
    assert_eq!(still_limited, 429);
}

#[test]
fn proxy_refuses_invalid_rules_with_their_location() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.yaml");
    std::fs::write(&path, "domain: g\ndescriptors: []\nroutes:\n  - path: /a/{id}\n    descriptors: [[{key: k, from: \"param:nope\"}]]\n").unwrap();
    let out = sluice()
        .args(["proxy", "--upstream", "http://127.0.0.1:9", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("gw.yaml:5:"), "{stderr}");
}

#[test]
fn bench_loads_the_trivial_upstream_and_reports_json() {
    let mut upstream = Spawned::spawn(
        sluice()
            .args(["bench", "upstream", "--listen", "127.0.0.1:0"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null()),
    );
    // It prints where it listens once it does: read that line, not a time.
    let mut lines =
        std::io::BufRead::lines(std::io::BufReader::new(upstream.0.stdout.take().unwrap()));
    let line = lines.next().and_then(Result::ok).unwrap_or_default();
    let url = line
        .rsplit(' ')
        .next()
        .filter(|u| u.starts_with("http://"))
        .map(|u| format!("{u}/items/{{n}}"));
    let out = url.as_ref().map(|url| {
        sluice()
            .args([
                "bench",
                "http",
                url,
                "--requests",
                "40",
                "--keys",
                "4",
                "-c",
                "4",
            ])
            .args(["-H", "x-user: u{n}", "--json"])
            .output()
            .unwrap()
    });
    drop(upstream);
    let out = out.unwrap_or_else(|| panic!("the upstream said {line:?}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["requests"], 40);
    assert_eq!(report["allowed"], 40);
    assert_eq!(report["measured"], 40);
    assert!(
        report["latency"]["p99_us"].as_f64().unwrap() > 0.0,
        "{report}"
    );
}

#[test]
fn bench_refuses_bad_options_with_a_reason() {
    for (args, why) in [
        (&["http", "https://127.0.0.1:1/"][..], "http://"),
        (
            &["http", "http://127.0.0.1:1/", "--duration", "soon"],
            "500ms",
        ),
        (&["http", "http://127.0.0.1:1/", "--rate=-5"], "rate"),
        (
            &[
                "grpc",
                "127.0.0.1:1",
                "--domain",
                "d",
                "--descriptor",
                "novalue",
            ],
            "key=value",
        ),
    ] {
        let out = sluice().arg("bench").args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    }
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/");
    let out = sluice()
        .args(["bench", "http", &url, "--requests", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot connect") && stderr.contains(&url),
        "{stderr}"
    );
}

#[test]
fn bench_help_shows_the_key_placeholder_in_place() {
    for command in ["http", "grpc"] {
        let out = sluice()
            .args(["bench", command, "--help"])
            .output()
            .unwrap();
        assert!(out.status.success());
        let help = String::from_utf8(out.stdout).unwrap();
        // Shown as `{n}`, exactly what a URL must hold, not broken across lines.
        assert!(help.contains("`{n}` becomes the key number"), "{help}");
        assert!(help.contains("How many key numbers `{n}` cycles"), "{help}");
        assert!(!help.contains("; `\n"), "{help}");
    }
}

/// Characters a reader cannot see but a copy carries along: zero-width ones, joiners, the soft
/// hyphen, bidirectional controls, the byte-order mark, and spaces that are not spaces.
fn invisible(c: char) -> bool {
    matches!(c,
        '\u{00A0}' | '\u{00AD}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202F}'
        | '\u{2060}'..='\u{206F}' | '\u{FEFF}')
        || (c.is_control() && c != '\n')
}

/// Every command's help, short and long, holds only characters a reader sees, so whatever is
/// copied from it is what it shows.
#[test]
fn no_help_text_holds_an_invisible_character() {
    let commands: [&[&str]; 9] = [
        &[],
        &["serve"],
        &["proxy"],
        &["bench"],
        &["bench", "http"],
        &["bench", "grpc"],
        &["bench", "upstream"],
        &["simulate"],
        &["validate"],
    ];
    for command in commands {
        for flag in ["-h", "--help"] {
            let out = sluice().args(command).arg(flag).output().unwrap();
            let help = String::from_utf8(out.stdout).unwrap();
            assert!(!help.is_empty(), "{command:?} {flag}");
            for (n, line) in help.lines().enumerate() {
                if let Some(c) = line.chars().find(|&c| invisible(c)) {
                    panic!(
                        "{command:?} {flag}, line {}: U+{:04X} in {line:?}",
                        n + 1,
                        c as u32
                    );
                }
            }
        }
    }
}

#[test]
fn validate_with_a_store_refuses_limits_it_cannot_hold_without_contacting_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yaml");
    std::fs::write(
        &path,
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {name: per_user, requests_per_unit: 10, window: 500d}\n",
    )
    .unwrap();
    let run = |store: &[&str]| {
        sluice()
            .arg("validate")
            .arg(&path)
            .args(store)
            .output()
            .unwrap()
    };
    // Nothing listens on port 1: the URL is only read.
    let out = run(&["--store", "redis://127.0.0.1:1"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!(
        "{}:4:17: rule \"per_user\" cannot be held by the redis store: the window of 500d",
        path.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    for store in [&[][..], &["--store", "memory"][..]] {
        let out = run(store);
        assert!(
            out.status.success(),
            "{store:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = run(&["--store", "mongodb://x"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown store `mongodb://x`"));
}

#[test]
fn validate_with_a_hybrid_store_refuses_the_sliding_log_with_its_location() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yaml");
    std::fs::write(
        &path,
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {name: log, algorithm: sliding_log, requests_per_unit: 10, unit: minute}\n",
    )
    .unwrap();
    let run = |store: &str| {
        sluice()
            .arg("validate")
            .arg(&path)
            .args(["--store", store])
            .output()
            .unwrap()
    };
    // Nothing listens on port 1: the URL is only read.
    let out = run("hybrid+redis://127.0.0.1:1?sync_interval=10ms");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!(
        "{}:4:17: rule \"log\" cannot be held by the hybrid store: sliding_log",
        path.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    let out = run("redis://127.0.0.1:1");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run("hybrid+redis://127.0.0.1:1?sync=1ms");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown parameter `sync=1ms`"));
}

/// The log of `sluice serve` with the example rules under an open-files limit of 1,024 (room
/// for 256 connections per listener), started with `args` and stopped once it listens.
fn start_log_under_1024_open_files(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/rules.yaml");
    let process = ServeProcess::builder(env!("CARGO_BIN_EXE_sluice"))
        .launched_by("prlimit", ["--nofile=1024:1024"])
        .config(rules)
        .args(args)
        .env("NO_COLOR", "1")
        .log_to(dir.path().join("log"))
        .start();
    drop(process);
    std::fs::read_to_string(dir.path().join("log")).unwrap()
}

/// Under an open-files limit too small for the `--max-connections` asked for, the cap is lowered
/// to fit, and the log says so at start.
#[test]
fn a_connection_cap_lowered_to_fit_the_open_files_limit_is_logged() {
    let text = start_log_under_1024_open_files(&["--max-connections", "16384"]);
    assert!(
        text.contains("fewer connections than --max-connections")
            && text.contains("max_connections=256"),
        "{text}"
    );
}

/// The default cap is a ceiling, not a request: a start that asks for nothing is not greeted
/// with a warning when the open-files limit holds fewer.
#[test]
fn a_default_start_says_nothing_of_the_open_files_limit() {
    // It listened, so it is past the point where the cap is set.
    let text = start_log_under_1024_open_files(&[]);
    assert!(!text.contains("WARN"), "{text}");
    assert!(!text.contains("open-files"), "{text}");
}

/// A port in use stops the start with a message that names the flag that chose it, for each
/// listener of `serve` and `proxy`.
#[test]
fn a_port_in_use_names_the_flag_to_change() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/rules.yaml");
    let gateway = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/gateway.yaml");
    let free = "127.0.0.1:0";
    let runs = [
        (
            "--http-addr",
            vec![
                "serve",
                "--config",
                rules,
                "--http-addr",
                &taken,
                "--grpc-addr",
                free,
            ],
        ),
        (
            "--grpc-addr",
            vec![
                "serve",
                "--config",
                rules,
                "--http-addr",
                free,
                "--grpc-addr",
                &taken,
            ],
        ),
        (
            "--listen",
            vec![
                "proxy",
                "--config",
                gateway,
                "--upstream",
                "http://127.0.0.1:9",
                "--listen",
                &taken,
            ],
        ),
        (
            "--admin-addr",
            vec![
                "proxy",
                "--config",
                gateway,
                "--upstream",
                "http://127.0.0.1:9",
                "--listen",
                free,
                "--admin-addr",
                &taken,
            ],
        ),
    ];
    for (flag, args) in runs {
        let out = sluice()
            .args(&args)
            .env("SLUICE_LOG", "error")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("cannot listen on {taken} ({flag}): "))
                && stderr.contains(&format!("give {flag} another port")),
            "{flag}: {stderr}"
        );
    }
}
