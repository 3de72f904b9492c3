//! The client's IP address, believing forwarding headers only from trusted proxies.
//!
//! A client that talks to Sluice directly could write any `X-Forwarded-For` it likes and so pick
//! its own per-IP counter. The headers are therefore read only when the socket peer is inside
//! the configured `trusted_proxies`, and then from right to left: each hop that is itself a
//! trusted proxy is skipped, and the first one that is not is the client. A malformed hop stops
//! the walk at the last address that was vouched for.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use http::header::FORWARDED;
use sluice_rules::Cidr;

/// The header that carries the forwarding chain in its de-facto form.
pub const X_FORWARDED_FOR: &str = "x-forwarded-for";

/// Writes `ip` as `Display` does. An IPv4 address is written by hand: `Display` pads through
/// the formatter, which costs more than the rest of a request's decision path.
pub fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            let mut text = [0u8; 15];
            let mut n = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    text[n] = b'.';
                    n += 1;
                }
                for (digit, shown) in [(octet / 100, octet >= 100), (octet / 10 % 10, octet >= 10)]
                {
                    if shown {
                        text[n] = b'0' + digit;
                        n += 1;
                    }
                }
                text[n] = b'0' + octet % 10;
                n += 1;
            }
            out.push_str(std::str::from_utf8(&text[..n]).unwrap_or_default());
        }
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// The client address of a request that arrived from `peer`.
///
/// `Forwarded` (RFC 7239) is read when present, else `X-Forwarded-For`; neither is read unless
/// `peer` is trusted.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[Cidr]) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let hops = if headers.contains_key(FORWARDED) {
        forwarded_hops(headers)
    } else {
        x_forwarded_for_hops(headers)
    };
    let mut client = peer;
    for hop in hops.iter().rev() {
        let Some(ip) = hop else {
            // An unreadable hop (`unknown`, an obfuscated name, garbage): nothing to its left
            // can be vouched for.
            break;
        };
        client = *ip;
        if !is_trusted(*ip) {
            break;
        }
    }
    client
}

/// Every hop of every `X-Forwarded-For` field, in order; `None` for one that is not an address.
fn x_forwarded_for_hops(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    headers
        .get_all(X_FORWARDED_FOR)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("\u{0}").split(','))
        .map(|hop| parse_node(hop.trim()))
        .collect()
}

/// The `for=` of every element of every `Forwarded` field, in order.
fn forwarded_hops(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    headers
        .get_all(FORWARDED)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("for=\u{0}").split(','))
        .map(|element| {
            element
                .split(';')
                .filter_map(|pair| pair.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("for"))
                .and_then(|(_, v)| parse_node(v.trim().trim_matches('"')))
        })
        .collect()
}

/// An address as forwarding headers write it: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1` or
/// `[2001:db8::1]:80`.
fn parse_node(text: &str) -> Option<IpAddr> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = text.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    text.strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .and_then(|t| t.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        let mut octets = vec![0u8, 1, 9, 10, 11, 99, 100, 101, 199, 200, 249, 250, 255];
        octets.extend((0..=255).step_by(17));
        for (i, a) in octets.iter().enumerate() {
            let b = octets[(i * 7 + 3) % octets.len()];
            for addr in [
                IpAddr::from([*a, b, 0, 255]),
                IpAddr::from([255, *a, b, 100]),
                IpAddr::from(std::net::Ipv6Addr::new(
                    0,
                    0,
                    0,
                    0,
                    0,
                    0xffff,
                    u16::from(*a),
                    1,
                )),
            ] {
                let mut text = String::new();
                push_ip(&mut text, addr);
                assert_eq!(text, addr.to_string());
            }
        }
        let mut text = String::from("a, ");
        push_ip(&mut text, ip("2001:db8::1"));
        assert_eq!(text, "a, 2001:db8::1");
    }

    #[test]
    fn an_untrusted_peer_cannot_choose_its_address() {
        let trusted: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
        let h = headers(&[("x-forwarded-for", "1.1.1.1")]);
        assert_eq!(
            client_ip(ip("203.0.113.9"), &h, &trusted),
            ip("203.0.113.9")
        );
        assert_eq!(client_ip(ip("203.0.113.9"), &h, &[]), ip("203.0.113.9"));
    }

    #[test]
    fn trusted_hops_are_skipped_from_the_right() {
        let trusted: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
        // The client prepended a lie; the first untrusted hop from the right is the real client.
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.0.0.2")]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &trusted), ip("198.51.100.7"));
        // Several fields are one list.
        let h = headers(&[
            ("x-forwarded-for", "198.51.100.7"),
            ("x-forwarded-for", "10.0.0.3"),
        ]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &trusted), ip("198.51.100.7"));
        // Garbage stops the walk at the last vouched-for hop.
        let h = headers(&[("x-forwarded-for", "1.1.1.1, garbage, 10.0.0.4")]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &trusted), ip("10.0.0.4"));
        // No header: the peer itself.
        assert_eq!(
            client_ip(ip("10.0.0.1"), &HeaderMap::new(), &trusted),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn forwarded_is_read_with_ports_and_brackets() {
        let trusted: Vec<Cidr> = vec!["127.0.0.1".parse().unwrap()];
        let h = headers(&[(
            "forwarded",
            "for=192.0.2.60;proto=http, for=\"[2001:db8:cafe::17]:4711\"",
        )]);
        assert_eq!(
            client_ip(ip("127.0.0.1"), &h, &trusted),
            ip("2001:db8:cafe::17")
        );
        let h = headers(&[("forwarded", "for=192.0.2.60:8080")]);
        assert_eq!(client_ip(ip("127.0.0.1"), &h, &trusted), ip("192.0.2.60"));
    }
}
