//! The statistics that envoyproxy/ratelimit's `USE_STATSD`, `STATSD_*`, `STATS_FLUSH_INTERVAL`,
//! `EXTRA_TAGS`, `NEAR_LIMIT_RATIO`, `DISABLE_STATS` and `USE_PROMETHEUS` ask for.

use crate::envoy_stats::{EnvoyStatsOptions, StatsdTarget};

use super::variables::{Env, go_duration};

/// The statistics the environment asks for: `None` when `DISABLE_STATS` turns them off, or
/// when neither statsd nor Prometheus is to receive them. `not_honoured` is told a statsd
/// protocol other than UDP.
pub(super) fn stats_options(
    env: &Env<'_>,
    not_honoured: &mut Vec<String>,
) -> Result<Option<EnvoyStatsOptions>, String> {
    let defaults = EnvoyStatsOptions::default();
    let use_statsd = env.flag("USE_STATSD", true)?;
    let prometheus = env.flag("USE_PROMETHEUS", false)?;
    // Every value is checked, used or not, as Envoy reads them all.
    let port = match env.get("STATSD_PORT") {
        None => 8125,
        Some(p) => p
            .parse()
            .map_err(|_| format!("STATSD_PORT={p}: expected a port number"))?,
    };
    let statsd = use_statsd.then(|| StatsdTarget {
        host: env.or("STATSD_HOST", "localhost").to_owned(),
        port,
    });
    let protocol = env.get("STATSD_PROTOCOL").filter(|_| use_statsd);
    if let Some(p) = protocol.filter(|p| !p.to_ascii_lowercase().starts_with("udp")) {
        not_honoured.push(format!(
            "STATSD_PROTOCOL={p} (statistics are sent over UDP)"
        ));
    }
    let flush_interval = match env.get("STATS_FLUSH_INTERVAL") {
        None => defaults.flush_interval,
        Some(text) => go_duration(text).filter(|d| !d.is_zero()).ok_or_else(|| {
            format!("STATS_FLUSH_INTERVAL={text}: expected a duration such as 10s")
        })?,
    };
    let near_limit_ratio = match env.get("NEAR_LIMIT_RATIO") {
        None => defaults.near_limit_ratio,
        Some(text) => text
            .parse::<f32>()
            .ok()
            .filter(|r| r.is_finite() && *r >= 0.0)
            .ok_or_else(|| format!("NEAR_LIMIT_RATIO={text}: expected a ratio such as 0.8"))?,
    };
    let extra_tags = match env.get("EXTRA_TAGS") {
        None => Vec::new(),
        Some(text) => extra_tags(text)?,
    };
    // DISABLE_STATS wins over every sink, as in Envoy; its value is checked all the same.
    if env.flag("DISABLE_STATS", false)? || (statsd.is_none() && !prometheus) {
        return Ok(None);
    }
    Ok(Some(EnvoyStatsOptions {
        statsd,
        flush_interval,
        near_limit_ratio,
        extra_tags,
        prometheus,
    }))
}

/// `EXTRA_TAGS` as Envoy reads it: `key:value` pairs separated by commas.
fn extra_tags(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .map(|pair| match pair.split_once(':') {
            Some((key, value)) if !value.contains(':') => Ok((key.to_owned(), value.to_owned())),
            _ => Err(format!(
                "EXTRA_TAGS={text}: expected key:value pairs separated by commas"
            )),
        })
        .collect()
}
