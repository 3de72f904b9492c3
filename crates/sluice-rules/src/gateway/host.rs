//! A route's host: exact or a subdomain wildcard, matched without the port.

/// A host to match: exact, or `*.example.com` for any subdomain. Case-insensitive, port
/// ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    /// This host only.
    Exact(String),
    /// Any host ending in this suffix (which starts with a dot).
    Suffix(String),
}

impl HostMatch {
    /// Parses `api.example.com` or `*.example.com`.
    pub fn parse(text: &str) -> HostMatch {
        let lower = text.to_ascii_lowercase();
        match lower.strip_prefix('*') {
            Some(suffix) => HostMatch::Suffix(suffix.to_owned()),
            None => HostMatch::Exact(lower),
        }
    }

    /// Whether `host` (which may carry a port) matches.
    pub fn matches(&self, host: &str) -> bool {
        let host = strip_port(host);
        match self {
            HostMatch::Exact(h) => host.eq_ignore_ascii_case(h),
            HostMatch::Suffix(s) => {
                host.len() > s.len()
                    && host.is_char_boundary(host.len() - s.len())
                    && host[host.len() - s.len()..].eq_ignore_ascii_case(s)
            }
        }
    }
}

/// `example.com:8080` → `example.com`; `[::1]:80` → `[::1]`.
pub fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split_once(']')
            .map_or(host, |(h, _)| &host[..=h.len()]);
    }
    match host.rsplit_once(':') {
        Some((h, port)) if !h.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        assert!(HostMatch::parse("API.example.com").matches("api.example.com:8080"));
        assert!(HostMatch::parse("*.example.com").matches("a.example.com"));
        assert!(!HostMatch::parse("*.example.com").matches("example.com"));
        assert_eq!(strip_port("[::1]:80"), "[::1]");
    }
}
