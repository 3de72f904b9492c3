//! A listener that cannot be bound, named by the setting that chose its address: a service
//! binds several, and "cannot listen on 127.0.0.1:8080" alone leaves a new user to guess which
//! of `--http-addr`, `--grpc-addr` or the others to change.

use std::io::ErrorKind;
use std::net::SocketAddr;

/// The settings that chose each listener's address: a flag (`--http-addr`) or, when the binary
/// runs as envoyproxy/ratelimit, its environment variables (`PORT`).
#[derive(Debug, Default)]
pub(crate) struct Listeners(Vec<(SocketAddr, &'static str)>);

impl Listeners {
    /// Adds the listener at `addr`, chosen by `setting`.
    pub(crate) fn at(mut self, setting: &'static str, addr: SocketAddr) -> Self {
        self.0.push((addr, setting));
        self
    }

    /// Adds the listener at `addr` when there is one.
    pub(crate) fn maybe_at(self, setting: &'static str, addr: Option<SocketAddr>) -> Self {
        match addr {
            Some(addr) => self.at(setting, addr),
            None => self,
        }
    }

    /// The error for `addr`, which could not be bound for `source`, naming every setting that
    /// asked for it: two settings that name one address is the mistake to see then.
    pub(crate) fn error(&self, addr: SocketAddr, source: std::io::Error) -> ListenError {
        let settings = self
            .0
            .iter()
            .filter(|(at, _)| *at == addr)
            .map(|(_, setting)| *setting)
            .collect();
        ListenError {
            addr,
            settings,
            source,
        }
    }
}

/// A listener could not be bound; the message says which setting to change, and how.
#[derive(Debug)]
pub(crate) struct ListenError {
    addr: SocketAddr,
    /// The settings whose value is `addr`; empty when none is known.
    settings: Vec<&'static str>,
    source: std::io::Error,
}

impl std::fmt::Display for ListenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (addr, source) = (self.addr, &self.source);
        let Some((last, others)) = self.settings.split_last() else {
            return write!(f, "cannot listen on {addr}: {source}");
        };
        if !others.is_empty() {
            return write!(
                f,
                "cannot listen on {addr}: {source}; {} and {last} both ask for it: give each \
                 listener an address of its own",
                others.join(", ")
            );
        }
        let next = match source.kind() {
            ErrorKind::AddrInUse => {
                format!("another process listens there: stop it, or give {last} another port")
            }
            ErrorKind::AddrNotAvailable => format!(
                "it is not an address of this host: give {last} one of its addresses, or \
                 0.0.0.0 for all of them"
            ),
            ErrorKind::PermissionDenied if addr.port() < 1024 => {
                format!("ports below 1024 need privileges: give {last} a port of 1024 or more")
            }
            _ => format!("give {last} another address"),
        };
        write!(f, "cannot listen on {addr} ({last}): {source}; {next}")
    }
}

impl std::error::Error for ListenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    fn listeners() -> Listeners {
        Listeners::default()
            .at("--http-addr", addr("127.0.0.1:8080"))
            .at("--grpc-addr", addr("127.0.0.1:8081"))
            .maybe_at("--admin-addr", None)
    }

    #[test]
    fn a_port_in_use_names_the_flag_that_chose_it() {
        let e = listeners().error(addr("127.0.0.1:8081"), ErrorKind::AddrInUse.into());
        let text = e.to_string();
        assert!(
            text.starts_with("cannot listen on 127.0.0.1:8081 (--grpc-addr): "),
            "{text}"
        );
        assert!(
            text.ends_with("stop it, or give --grpc-addr another port"),
            "{text}"
        );
    }

    #[test]
    fn two_flags_on_one_address_are_both_named() {
        let both = Listeners::default()
            .at("--http-addr", addr("127.0.0.1:8080"))
            .at("--grpc-addr", addr("127.0.0.1:8080"));
        let text = both
            .error(addr("127.0.0.1:8080"), ErrorKind::AddrInUse.into())
            .to_string();
        assert!(
            text.contains("--http-addr and --grpc-addr both ask for it"),
            "{text}"
        );
    }

    #[test]
    fn an_address_of_another_host_and_a_privileged_port_say_what_to_give() {
        let l = Listeners::default()
            .at("--listen", addr("10.9.9.9:8000"))
            .at("--admin-addr", addr("127.0.0.1:80"));
        let text = l
            .error(addr("10.9.9.9:8000"), ErrorKind::AddrNotAvailable.into())
            .to_string();
        assert!(
            text.contains("give --listen one of its addresses"),
            "{text}"
        );
        let text = l
            .error(addr("127.0.0.1:80"), ErrorKind::PermissionDenied.into())
            .to_string();
        assert!(
            text.contains("give --admin-addr a port of 1024 or more"),
            "{text}"
        );
    }

    #[test]
    fn an_address_no_setting_chose_is_still_named() {
        let text = listeners()
            .error(addr("127.0.0.1:9"), ErrorKind::AddrInUse.into())
            .to_string();
        assert!(text.starts_with("cannot listen on 127.0.0.1:9: "), "{text}");
    }
}
