//! Envoy's statistics as Prometheus reads them from envoyproxy/ratelimit with
//! `USE_PROMETHEUS`: the names and labels its default statsd-exporter mapping gives them, so
//! that dashboards and alerts written against it find the same series.
//!
//! - `ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode}`
//!   with `domain` and `key1` from the statistics key's first two levels, and `key2` from the
//!   third when it has one (deeper levels are not labels, as in the mapping);
//! - `ratelimit_service_should_rate_limit_error{err_type}`;
//! - `ratelimit_service_total_requests{grpc_method}` and the histogram
//!   `ratelimit_service_response_time_seconds{grpc_method}`, on the exporter's default buckets;
//! - `ratelimit_service_config_load_success`, `ratelimit_service_config_load_error`, and
//!   `ratelimit_service_global_shadow_mode` (the name the exporter gives a statistic the
//!   mapping does not list).
//!
//! As from the exporter, a series shows once it has counted something. The text is in the
//! OpenMetrics form of the listener's other series; the counters keep the exporter's names,
//! which do not end in `_total` as OpenMetrics counters must, so their type is `unknown`,
//! which Prometheus reads as untyped samples under exactly these names.

use std::fmt::Write as _;

use super::{EnvoyStats, LIMIT_STATS, SERVICE_STATS};

/// The statsd exporter's default histogram buckets, in seconds.
const BUCKETS: [(f64, &str); 11] = [
    (0.005, "0.005"),
    (0.01, "0.01"),
    (0.025, "0.025"),
    (0.05, "0.05"),
    (0.1, "0.1"),
    (0.25, "0.25"),
    (0.5, "0.5"),
    (1.0, "1.0"),
    (2.5, "2.5"),
    (5.0, "5.0"),
    (10.0, "10.0"),
];

/// Writes the statistics' Prometheus text to `out`.
pub(super) fn render(stats: &EnvoyStats, out: &mut String) {
    let limits = stats.limit_totals();
    for (i, stat) in LIMIT_STATS.iter().enumerate() {
        let family = format!("ratelimit_service_rate_limit_{stat}");
        let mut header = Some(());
        for (key, totals) in &limits {
            if totals[i] == 0 {
                continue;
            }
            let mut levels = key.split('.');
            let (Some(domain), Some(key1)) = (levels.next(), levels.next()) else {
                continue;
            };
            if header.take().is_some() {
                family_header(
                    out,
                    &family,
                    "unknown",
                    "Hits of the limits of this descriptor",
                );
            }
            out.push_str(&family);
            out.push_str("{domain=");
            label_value(out, domain);
            out.push_str(",key1=");
            label_value(out, key1);
            if let Some(key2) = levels.next() {
                out.push_str(",key2=");
                label_value(out, key2);
            }
            let _ = writeln!(out, "}} {}", totals[i]);
        }
    }

    let [
        requests,
        redis_errors,
        service_errors,
        global_shadow,
        loads,
        load_errors,
    ] = stats.service_totals();
    debug_assert_eq!(SERVICE_STATS.len(), 6);
    if redis_errors + service_errors > 0 {
        let family = "ratelimit_service_should_rate_limit_error";
        family_header(
            out,
            family,
            "unknown",
            "ShouldRateLimit calls that met an error",
        );
        for (kind, n) in [
            ("redis_error", redis_errors),
            ("service_error", service_errors),
        ] {
            if n > 0 {
                let _ = writeln!(out, "{family}{{err_type=\"{kind}\"}} {n}");
            }
        }
    }
    if requests > 0 {
        let family = "ratelimit_service_total_requests";
        family_header(out, family, "unknown", "gRPC calls by method");
        let _ = writeln!(
            out,
            "{family}{{grpc_method=\"ShouldRateLimit\"}} {requests}"
        );
        response_times(stats, out);
    }
    for (family, n, help) in [
        (
            "ratelimit_service_config_load_success",
            loads,
            "Rule loads that succeeded",
        ),
        (
            "ratelimit_service_config_load_error",
            load_errors,
            "Rule loads that failed",
        ),
        (
            "ratelimit_service_global_shadow_mode",
            global_shadow,
            "Answers the service-wide shadow mode turned from OVER_LIMIT to OK",
        ),
    ] {
        if n > 0 {
            family_header(out, family, "unknown", help);
            let _ = writeln!(out, "{family} {n}");
        }
    }
}

/// `ratelimit_service_response_time_seconds`, from the calls counted per whole millisecond.
fn response_times(stats: &EnvoyStats, out: &mut String) {
    let family = "ratelimit_service_response_time_seconds";
    family_header(
        out,
        family,
        "histogram",
        "ShouldRateLimit response times, in whole milliseconds",
    );
    let times = stats.response_times.totals();
    let label = "grpc_method=\"ShouldRateLimit\"";
    for (bound, text) in BUCKETS {
        let within: u64 = times
            .iter()
            .filter(|(ms, _)| seconds(*ms) <= bound)
            .map(|(_, n)| n)
            .sum();
        let _ = writeln!(out, "{family}_bucket{{{label},le=\"{text}\"}} {within}");
    }
    let count: u64 = times.iter().map(|(_, n)| n).sum();
    #[allow(clippy::cast_precision_loss)]
    let sum: f64 = times.iter().map(|(ms, n)| seconds(*ms) * *n as f64).sum();
    let _ = writeln!(out, "{family}_bucket{{{label},le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{family}_sum{{{label}}} {sum}");
    let _ = writeln!(out, "{family}_count{{{label}}} {count}");
}

#[allow(clippy::cast_precision_loss)]
fn seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

fn family_header(out: &mut String, family: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# TYPE {family} {kind}");
    let _ = writeln!(out, "# HELP {family} {help} (envoyproxy/ratelimit's name).");
}

/// `value` as a quoted label value, escaped as the text format needs.
fn label_value(out: &mut String, value: &str) {
    out.push('"');
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
}
