//! The store URL that envoyproxy/ratelimit's `BACKEND_TYPE` and `REDIS_*` variables describe:
//! one server, a Cluster or Sentinels, with TLS and credentials.

use super::variables::Env;

/// The store URL that `BACKEND_TYPE` and the `REDIS_*` variables describe.
pub(super) fn store_url(env: &Env<'_>) -> Result<String, String> {
    match env
        .or("BACKEND_TYPE", "redis")
        .to_ascii_lowercase()
        .as_str()
    {
        "redis" => {}
        "memcache" => {
            return Err(
                "BACKEND_TYPE=memcache: Sluice keeps shared counters in Redis \
                 (BACKEND_TYPE=redis), or set SLUICE_STORE=memory for one instance"
                    .to_owned(),
            );
        }
        other => return Err(format!("BACKEND_TYPE={other}: expected redis")),
    }
    if !env
        .or("REDIS_SOCKET_TYPE", "unix")
        .eq_ignore_ascii_case("tcp")
    {
        return Err(
            "REDIS_SOCKET_TYPE: Sluice reaches Redis over TCP; set REDIS_SOCKET_TYPE=tcp and \
             REDIS_URL=host:port"
                .to_owned(),
        );
    }
    let url = env
        .get("REDIS_URL")
        .ok_or("REDIS_URL must name the Redis server as host:port")?;
    let scheme = if env.flag("REDIS_TLS", false)? {
        "rediss"
    } else {
        "redis"
    };
    // REDIS_AUTH is a password, or user:password.
    let credentials =
        env.get("REDIS_AUTH")
            .map_or_else(String::new, |auth| match auth.split_once(':') {
                Some((user, password)) => format!("{}:{}@", encode(user), encode(password)),
                None => format!(":{}@", encode(auth)),
            });
    let hosts = |list: &str| -> Vec<String> {
        list.split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(str::to_owned)
            .collect()
    };
    Ok(
        match env.or("REDIS_TYPE", "SINGLE").to_ascii_uppercase().as_str() {
            "SINGLE" => format!("{scheme}://{credentials}{url}"),
            "CLUSTER" => format!("{scheme}+cluster://{credentials}{}", hosts(url).join(",")),
            "SENTINEL" => {
                // The master's name, then the Sentinels.
                let mut parts = hosts(url);
                if parts.len() < 2 {
                    return Err(format!(
                        "REDIS_URL={url}: with REDIS_TYPE=SENTINEL, give the master's name and \
                         then the Sentinels, as mymaster,host:26379,host:26379"
                    ));
                }
                let master = parts.remove(0);
                format!(
                    "{scheme}+sentinel://{credentials}{}/{master}",
                    parts.join(",")
                )
            }
            other => {
                return Err(format!(
                    "REDIS_TYPE={other}: expected SINGLE, SENTINEL or CLUSTER"
                ));
            }
        },
    )
}

/// Percent-encodes what a URL's user information cannot hold as it is.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
