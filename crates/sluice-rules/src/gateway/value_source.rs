//! Where a route's descriptor entry takes its value from: the client IP, a header, a query
//! parameter, a cookie, a credential, a part of the request, or a constant.

/// Where an entry's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueSource {
    /// The client IP: the socket peer, or the forwarded client when the peer is a trusted proxy.
    ClientIp,
    /// A request header (the name in lower case).
    Header(String),
    /// A query parameter, percent-decoded.
    Query(String),
    /// A cookie.
    Cookie(String),
    /// The token of an `Authorization: Bearer` header.
    Bearer,
    /// The API key: the bearer token, else the `X-API-Key` header.
    ApiKey,
    /// The request path, without the query.
    Path,
    /// A parameter of the route's path pattern.
    PathParam(String),
    /// The method.
    Method,
    /// The host, without the port.
    Host,
    /// A fixed value, for global limits.
    Constant(String),
}

impl ValueSource {
    /// The forms `from:` accepts, for error messages.
    pub const FORMS: [&'static str; 10] = [
        "client_ip",
        "method",
        "path",
        "host",
        "bearer",
        "api_key",
        "header:NAME",
        "query:NAME",
        "cookie:NAME",
        "param:NAME",
    ];

    /// Parses a `from:` value; `None` for an unknown form.
    pub fn parse(text: &str) -> Option<ValueSource> {
        let named = |prefix: &str| {
            text.strip_prefix(prefix)
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
        };
        Some(match text {
            "client_ip" => ValueSource::ClientIp,
            "method" => ValueSource::Method,
            "path" => ValueSource::Path,
            "host" => ValueSource::Host,
            "bearer" => ValueSource::Bearer,
            "api_key" => ValueSource::ApiKey,
            _ => {
                if let Some(n) = named("header:") {
                    ValueSource::Header(n.to_ascii_lowercase())
                } else if let Some(n) = named("query:") {
                    ValueSource::Query(n)
                } else if let Some(n) = named("cookie:") {
                    ValueSource::Cookie(n)
                } else if let Some(n) = named("param:") {
                    ValueSource::PathParam(n)
                } else {
                    return None;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_sources() {
        assert_eq!(
            ValueSource::parse("header:X-User"),
            Some(ValueSource::Header("x-user".into()))
        );
        assert_eq!(ValueSource::parse("header:"), None);
        assert_eq!(ValueSource::parse("nope"), None);
    }
}
