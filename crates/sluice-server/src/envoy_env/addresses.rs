//! The listening addresses that envoyproxy/ratelimit's host and port variables name, as Go
//! reads them (`:9090` is every address).

use std::net::{SocketAddr, ToSocketAddrs};

use super::variables::Env;

/// The listening address of a host and a port variable.
pub(super) fn address(
    env: &Env<'_>,
    host_var: &str,
    port_var: &str,
    port: u16,
) -> Result<SocketAddr, String> {
    let host = env.or(host_var, "0.0.0.0");
    let port = match env.get(port_var) {
        None => port,
        Some(p) => p
            .parse()
            .map_err(|_| format!("{port_var}={p}: expected a port number"))?,
    };
    resolve(host, port).map_err(|e| format!("{host_var}={host}: {e}"))
}

/// `host:port` or `:port` (every address), as Go listens on it.
pub(super) fn listen_addr(addr: &str) -> Result<SocketAddr, String> {
    let (host, port) = addr.rsplit_once(':').ok_or("expected host:port or :port")?;
    let port = port.parse().map_err(|_| "expected a port number")?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    resolve(if host.is_empty() { "0.0.0.0" } else { host }, port)
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or_else(|| "names no address".to_owned())
}
