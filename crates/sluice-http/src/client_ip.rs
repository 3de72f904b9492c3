//! The client's IP address, believing forwarding headers only from trusted proxies.
//!
//! A client that talks to Sluice directly could write any `X-Forwarded-For` it likes and so pick
//! its own per-IP counter. The headers are therefore read only when the socket peer is inside
//! the configured `trusted_proxies`, and then from right to left: each hop that is itself a
//! trusted proxy is skipped, and the first one that is not is the client. A malformed hop stops
//! the walk at the last address that was vouched for.
//!
//! Only one header is read: the one the trusted proxies write, `X-Forwarded-For` unless told
//! otherwise ([`ForwardedHeader`]). A proxy appends to its own header and passes every other
//! header through untouched, so a client behind nginx (which appends only `X-Forwarded-For`)
//! could otherwise send its own `Forwarded: for=…`, which no trusted hop wrote, and pick its
//! counter with it. Which header a deployment's proxies write is a fact of the deployment, so it
//! is a setting, as Envoy's `xff_num_trusted_hops` and nginx's `real_ip_header` are.

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

/// Which forwarding header the trusted proxies write, and so the only one read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For`, which nginx, HAProxy, Envoy and the cloud load balancers append to.
    #[default]
    XForwardedFor,
    /// `Forwarded` (RFC 7239), for proxies that write it instead.
    Forwarded,
}

impl ForwardedHeader {
    /// The name on the command line: `x-forwarded-for` or `forwarded`.
    pub fn name(self) -> &'static str {
        match self {
            ForwardedHeader::XForwardedFor => X_FORWARDED_FOR,
            ForwardedHeader::Forwarded => "forwarded",
        }
    }
}

impl std::str::FromStr for ForwardedHeader {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            X_FORWARDED_FOR => Ok(ForwardedHeader::XForwardedFor),
            "forwarded" => Ok(ForwardedHeader::Forwarded),
            _ => Err(format!(
                "`{s}` is not a forwarding header; use x-forwarded-for or forwarded"
            )),
        }
    }
}

/// The client address of a request that arrived from `peer`: the peer itself unless it is
/// trusted, else the first untrusted hop from the right of `header`'s chain. The other
/// forwarding header is never read, whoever wrote it.
pub fn client_ip(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &[Cidr],
    header: ForwardedHeader,
) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let hops = match header {
        ForwardedHeader::XForwardedFor => x_forwarded_for_hops(headers),
        ForwardedHeader::Forwarded => forwarded_hops(headers),
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

    const XFF: ForwardedHeader = ForwardedHeader::XForwardedFor;
    const FWD: ForwardedHeader = ForwardedHeader::Forwarded;

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
            client_ip(ip("203.0.113.9"), &h, &trusted, XFF),
            ip("203.0.113.9")
        );
        assert_eq!(
            client_ip(ip("203.0.113.9"), &h, &[], XFF),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn trusted_hops_are_skipped_from_the_right() {
        let trusted: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
        // The client prepended a lie; the first untrusted hop from the right is the real client.
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.0.0.2")]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &h, &trusted, XFF),
            ip("198.51.100.7")
        );
        // Several fields are one list.
        let h = headers(&[
            ("x-forwarded-for", "198.51.100.7"),
            ("x-forwarded-for", "10.0.0.3"),
        ]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &h, &trusted, XFF),
            ip("198.51.100.7")
        );
        // Garbage stops the walk at the last vouched-for hop.
        let h = headers(&[("x-forwarded-for", "1.1.1.1, garbage, 10.0.0.4")]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &trusted, XFF), ip("10.0.0.4"));
        // No header: the peer itself.
        assert_eq!(
            client_ip(ip("10.0.0.1"), &HeaderMap::new(), &trusted, XFF),
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
            client_ip(ip("127.0.0.1"), &h, &trusted, FWD),
            ip("2001:db8:cafe::17")
        );
        let h = headers(&[("forwarded", "for=192.0.2.60:8080")]);
        assert_eq!(
            client_ip(ip("127.0.0.1"), &h, &trusted, FWD),
            ip("192.0.2.60")
        );
    }

    /// Every mix of who writes which header: the client may send `X-Forwarded-For`,
    /// `Forwarded`, both or neither, with addresses of its choosing; the proxy in front appends
    /// the real client to one header, the other, or both. Whenever the proxy writes the header
    /// Sluice is told to read, the answer is the real client, never a spoofed address; when it
    /// writes neither, the answer is the proxy itself, never a spoofed address either.
    #[test]
    fn no_mix_of_client_and_proxy_headers_lets_a_client_choose_its_address() {
        let proxy = ip("10.0.0.1");
        let real = "198.51.100.7";
        let trusted: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
        let spoofs = ["6.6.6.6", "10.9.9.9", "unknown", "2001:db8::66"];
        for read in [XFF, FWD] {
            for spoof in spoofs {
                for client_sends in [(false, false), (true, false), (false, true), (true, true)] {
                    for proxy_writes in [(false, false), (true, false), (false, true), (true, true)]
                    {
                        let mut xff: Vec<String> = Vec::new();
                        let mut fwd: Vec<String> = Vec::new();
                        if client_sends.0 {
                            xff.push(spoof.to_owned());
                        }
                        if client_sends.1 {
                            fwd.push(format!("for=\"{spoof}\""));
                        }
                        if proxy_writes.0 {
                            xff.push(real.to_owned());
                        }
                        if proxy_writes.1 {
                            fwd.push(format!("for={real}"));
                        }
                        let mut h = HeaderMap::new();
                        if !xff.is_empty() {
                            h.insert(X_FORWARDED_FOR, xff.join(", ").parse().unwrap());
                        }
                        if !fwd.is_empty() {
                            h.insert(FORWARDED, fwd.join(", ").parse().unwrap());
                        }
                        let got = client_ip(proxy, &h, &trusted, read);
                        let case = format!(
                            "read {read:?}, client sends {client_sends:?} {spoof}, proxy writes {proxy_writes:?}"
                        );
                        let proxy_wrote_it = match read {
                            ForwardedHeader::XForwardedFor => proxy_writes.0,
                            ForwardedHeader::Forwarded => proxy_writes.1,
                        };
                        if proxy_wrote_it {
                            assert_eq!(got, ip(real), "{case}");
                        } else {
                            // Nothing a trusted hop wrote names a client. What the client sent
                            // in the header read stands unverified, as it would with no
                            // proxy: this is the misconfiguration the setting documents, and
                            // the spoof of the header not read must never win.
                            let sent_in_read = match read {
                                ForwardedHeader::XForwardedFor => client_sends.0,
                                ForwardedHeader::Forwarded => client_sends.1,
                            };
                            if !sent_in_read {
                                assert_eq!(got, proxy, "{case}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_header_to_read_is_named_on_the_command_line() {
        assert_eq!("x-forwarded-for".parse(), Ok(XFF));
        assert_eq!("Forwarded".parse(), Ok(FWD));
        assert!("x-real-ip".parse::<ForwardedHeader>().is_err());
        assert_eq!(FWD.name(), "forwarded");
    }
}
